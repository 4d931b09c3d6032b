"""Milliseconds from a fresh process's start to its first finished appends on the GPU, median of N processes.

    python tools/first_call_time.py [N]        default N: 7

Each child process times four steps: CUDA initialised by torch, `import nvfp4kv`, the first K/V append and the
first MLA append (each synchronised). The first call of an op pays for loading its CUDA module, so comparing a
build with `NVFP4KV_COMPRESS_FATBIN=ON` against one without it shows what the decompression costs
(docs/WHEEL.md). Run it outside the source tree, so that the installed package is what is imported.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
import nvfp4kv
t2 = time.perf_counter()

def index(values):
    return torch.tensor(values, dtype=torch.int32, device="cuda")

rows, one_request = index([0] * 8), (index([0]), index([0, 1]), index([8]))
cache = torch.zeros(4, 2, 16, 2, 64, dtype=torch.uint8, device="cuda")
cache_sf = torch.zeros(4, 2, 16, 2, 8, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
key = torch.randn(8, 2, 128, device="cuda", dtype=torch.bfloat16)
nvfp4kv.nvfp4_quantize_append_paged_kv_cache(key, key.clone(), rows, index(list(range(8))), cache, cache_sf,
                                             *one_request, 1.0, 1.0)
torch.cuda.synchronize()
t3 = time.perf_counter()
ckv = torch.zeros(4, 16, 256, dtype=torch.uint8, device="cuda")
ckv_sf = torch.zeros(4, 16, 32, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
kpe = torch.zeros(4, 16, 64, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
latent = torch.randn(8, 576, device="cuda", dtype=torch.bfloat16)
nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(latent[:, :512], latent[:, 512:], rows, index(list(range(8))),
                                                 ckv, ckv_sf, kpe, *one_request, 1.0, 1.0)
torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"torch_cuda": t1 - t0, "import": t2 - t1, "first_append": t3 - t2, "first_mla_append": t4 - t3}))
"""


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    runs = []
    for _ in range(count):
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    medians = {step: round(statistics.median(run[step] for run in runs) * 1e3, 2) for step in runs[0]}
    print(json.dumps({"processes": count, "median_ms": medians}))


if __name__ == "__main__":
    main()
