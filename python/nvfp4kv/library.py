"""Loads the compiled op library (libnvfp4kv.so) into torch's dispatcher, once."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import List

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent


def cmake_prefix_path() -> str:
    """Prefix of the installed CMake package (lib/cmake/nvfp4kv/nvfp4kvConfig.cmake under it), for
    find_package(nvfp4kv): the package folder, which also holds lib/ and include/."""
    return str(_PACKAGE_DIR)


def library_path() -> Path:
    """Path of the installed shared library (override with NVFP4KV_LIBRARY for a build tree)."""
    override = os.environ.get("NVFP4KV_LIBRARY")
    return Path(override) if override else _PACKAGE_DIR / "lib" / "libnvfp4kv.so"


def load() -> None:
    path = library_path()
    if not path.exists():
        raise ImportError(
            f"nvfp4kv: compiled library not found at {path}; install the package with "
            "`pip install --no-build-isolation .` from the repository root"
        )
    torch.ops.load_library(str(path))


def has_cuda_kernels() -> bool:
    """True when the loaded library registered CUDA kernels (built with nvcc)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("nvfp4kv::append_paged_kv_cache", "CUDA")


def cuda_architectures() -> List[str]:
    """The CUDA architectures of the loaded library's fat binary as CMake lists them (e.g. "90-real",
    "80-virtual"); empty for a CPU-only build."""
    library = ctypes.CDLL(str(library_path()))
    if not hasattr(library, "nvfp4kv_cuda_architectures"):
        return []
    library.nvfp4kv_cuda_architectures.restype = ctypes.c_char_p
    return library.nvfp4kv_cuda_architectures().decode().split()


def force_kernel_mode(mode: str) -> None:
    """Test and benchmark hook (cpp/src/cuda/build_info.cpp), not a user setting: every aligned append runs
    kernel mode `mode` ("auto", "pair", "split", "oneshot"; cpp/src/cuda/kernel_mode.h says what each means
    per op) until it is set back to "auto"."""
    hook = ctypes.CDLL(str(library_path())).nvfp4kv_test_force_kernel_mode
    if hook(mode.encode()) != 0:
        raise ValueError(f"kernel mode must be one of auto, pair, split, oneshot, got {mode!r}")
