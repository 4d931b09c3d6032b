"""What the installed package promises: one Python-agnostic wheel, a library that depends on
libtorch_cpu.so alone (stable ABI, static CUDA runtime), CUDA kernels whenever nvcc built them,
and the public C++ headers."""

import importlib.metadata
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import nvfp4kv
from nvfp4kv import library

REPOSITORY = Path(__file__).resolve().parent.parent

# What a C++ shared library may need from the system besides torch.
SYSTEM_LIBRARIES = (
    "libc.so",
    "libm.so",
    "libdl.so",
    "libpthread.so",
    "librt.so",
    "libstdc++.so",
    "libgcc_s.so",
    "ld-linux",
)


def needed_libraries():
    if shutil.which("readelf") is None:
        pytest.skip("readelf not available")
    dynamic = subprocess.run(
        ["readelf", "-d", str(library.library_path())], check=True, capture_output=True, text=True
    ).stdout
    return [line.split("[")[1].split("]")[0] for line in dynamic.splitlines() if "(NEEDED)" in line]


def test_library_depends_on_libtorch_cpu_only():
    needed = needed_libraries()
    torch_libraries = [n for n in needed if not n.startswith(SYSTEM_LIBRARIES)]
    assert torch_libraries == ["libtorch_cpu.so"], needed


def test_wheel_is_tagged_for_any_cpython3():
    try:
        wheel = importlib.metadata.distribution("nvfp4kv").read_text("WHEEL")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("running from a source tree, not an installed wheel")
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    assert tags and all(tag.startswith("py3-none-") for tag in tags), tags


def test_cuda_kernels_are_built_where_nvcc_exists():
    """A build on a machine with nvcc must contain the CUDA kernels (CI builds them too)."""
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on this machine")
    assert library.has_cuda_kernels()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("nvfp4kv::dequantize", "CUDA")


def cmake_architectures():
    """NVFP4KV_CUDA_ARCHITECTURES as cmake/cuda_architectures.cmake sets it: the one place it is written."""
    text = (REPOSITORY / "cmake" / "cuda_architectures.cmake").read_text()
    return re.search(r'set\(NVFP4KV_CUDA_ARCHITECTURES "([^"]+)"', text).group(1).split(";")


def test_cuda_architectures_flow_from_cmake():
    """The library reports CMake's list, and the README states the same one."""
    architectures = cmake_architectures()
    if library.has_cuda_kernels():
        assert library.cuda_architectures() == architectures
    real = [a.split("-")[0] for a in architectures if a.endswith("-real")]
    virtual = [a.split("-")[0] for a in architectures if a.endswith("-virtual")]
    readme = (REPOSITORY / "README.md").read_text()
    stated = f"SASS for sm_{', '.join(real)} and PTX for sm_{', '.join(virtual)}"
    assert stated in " ".join(readme.split()), stated


def test_cpu_kernels_and_fakes_are_registered():
    for op in ("nvfp4kv::append_paged_kv_cache", "nvfp4kv::dequantize"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "Meta")


def test_public_headers_are_installed():
    header = library.library_path().parent.parent / "include" / "nvfp4kv" / "nvfp4_codec.h"
    if not header.exists():
        pytest.skip("running against a build tree, not an installed package")
    assert "quantize_block" in header.read_text()


def test_cmake_package_is_installed():
    """find_package(nvfp4kv) with CMAKE_PREFIX_PATH=nvfp4kv.cmake_prefix_path (tests/cpp builds against it)."""
    from pathlib import Path

    prefix = Path(nvfp4kv.cmake_prefix_path)
    config = prefix / "lib" / "cmake" / "nvfp4kv" / "nvfp4kvConfig.cmake"
    if not (prefix / "lib" / "libnvfp4kv.so").exists() or library.library_path().parent != prefix / "lib":
        pytest.skip("running against a build tree, not an installed package")
    assert config.exists() and (config.parent / "nvfp4kvConfigVersion.cmake").exists()
    assert "nvfp4kv::nvfp4kv" in config.read_text()
    for header in ("nvfp4kv.h", "page.h", "fp4_quantization.h", "operator.h", "nvfp4_codec.h"):
        assert (prefix / "include" / "nvfp4kv" / header).exists(), header
