"""nvfp4kv: bit-exact NVFP4 quantize-and-append for paged KV caches (CPU and CUDA PyTorch ops).

Call path: nvfp4kv.nvfp4_quantize_append_paged_kv_cache (page.py) -> torch.ops.nvfp4kv.* (schemas in
cpp/src/registration.cpp) -> the dispatcher -> the CPU or CUDA kernel in libnvfp4kv.so.
"""

from . import library as _library

_library.load()

from . import fake as _fake  # noqa: E402,F401  (registers the fake implementations)
from .calibration import global_scale_from_amax  # noqa: E402
from .debug_checks import set_debug_checks  # noqa: E402
from .fp4_quantization import dequantize  # noqa: E402
from .mla import nvfp4_quantize_append_paged_mla_kv_cache, nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping  # noqa: E402
from .page import (  # noqa: E402
    convert_v_scale_layout,
    dequantize_paged_kv_cache,
    dequantize_paged_mla_kv_cache,
    get_batch_indices_positions,
    get_seq_lens,
    nvfp4_quantize_append_paged_kv_cache,
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping,
    rope_quantize_nvfp4_append_paged_kv_cache,
    rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping,
)

__version__ = "0.1.0"

# CMAKE_PREFIX_PATH entry for find_package(nvfp4kv) in C++ projects (README, "C++ usage").
cmake_prefix_path = _library.cmake_prefix_path()

__all__ = [
    "convert_v_scale_layout",
    "dequantize",
    "dequantize_paged_kv_cache",
    "dequantize_paged_mla_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
    "global_scale_from_amax",
    "nvfp4_quantize_append_paged_kv_cache",
    "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
    "nvfp4_quantize_append_paged_mla_kv_cache",
    "nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping",
    "rope_quantize_nvfp4_append_paged_kv_cache",
    "rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping",
    "set_debug_checks",
]
