"""nvfp4kv: bit-exact NVFP4 quantize-and-append for paged KV caches (CPU and CUDA PyTorch ops).

Call path: nvfp4kv.nvfp4_quantize_append_paged_kv_cache (page.py) -> torch.ops.nvfp4kv.* (schemas in
cpp/src/registration.cpp) -> the dispatcher -> the CPU or CUDA kernel in libnvfp4kv.so.
"""

from . import library as _library

_library.load()

from . import fake as _fake  # noqa: E402,F401  (registers the fake implementations)
from .fp4_quantization import dequantize  # noqa: E402
from .page import (  # noqa: E402
    get_batch_indices_positions,
    get_seq_lens,
    nvfp4_quantize_append_paged_kv_cache,
)

__version__ = "0.1.0"

__all__ = [
    "dequantize",
    "get_batch_indices_positions",
    "get_seq_lens",
    "nvfp4_quantize_append_paged_kv_cache",
]
