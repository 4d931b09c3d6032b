"""Writes what the C++ deployment tests (test_deployment.cpp) load, into the folder given as argv[1]:

  append_hnd.torchscript.pt  AppendAndDequantize(HND) scripted and saved with torch.jit.save
  append_nhd.pt2             AppendAndDequantize(NHD) exported and compiled by AOTInductor for the CPU
  append_nhd_cuda.pt2        the same compiled for CUDA (only where a GPU is available)
  cases.pt                   for each: the inputs, and the caches and output that Python computed
                             (eager op); the C++ side runs the artifact and compares every byte.

Run by ctest as the setup fixture of the deployment tests.
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: append_cases, deployment_modules

from deployment_modules import CACHE_INPUTS, cloned, make_inputs  # noqa: E402


def expected(module, inputs):
    """The caches after the eager call (uint8 views, so float8 scales compare bytewise) and the output."""
    after = cloned(inputs)
    output = module(*after)
    return [after[i].view(torch.uint8) for i in CACHE_INPUTS], output


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cases = {}

    module, inputs = make_inputs("HND", seed=21)
    torch.jit.script(module).save(str(folder / "append_hnd.torchscript.pt"))
    caches, output = expected(module, inputs)
    cases["torchscript"] = {"inputs": inputs, "caches": caches, "output": output}

    module, inputs = make_inputs("NHD", seed=22)
    start = time.time()
    program = torch.export.export(module, tuple(cloned(inputs)))
    torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "append_nhd.pt2"))
    print(f"AOTInductor package compiled in {time.time() - start:.1f} s")
    if torch.cuda.is_available():
        start = time.time()
        program = torch.export.export(module, tuple(t.cuda() for t in cloned(inputs)))
        torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "append_nhd_cuda.pt2"))
        print(f"AOTInductor CUDA package compiled in {time.time() - start:.1f} s")
    caches, output = expected(module, inputs)
    cases["aoti"] = {"inputs": inputs, "caches": caches, "output": output}

    # float8 tensors travel as uint8 (their bytes); the C++ side views the scale caches back.
    def portable(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    torch.save(
        {
            name: {
                key: [portable(t) for t in value] if isinstance(value, list) else value for key, value in case.items()
            }
            for name, case in cases.items()
        },
        str(folder / "cases.pt"),
    )
    print(f"wrote {sorted(p.name for p in folder.iterdir())} to {folder}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
