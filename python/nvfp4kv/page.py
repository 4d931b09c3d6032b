"""The FlashInfer-compatible paged-KV API (flashinfer.page.nvfp4_quantize_append_paged_kv_cache)."""

from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch
from torch.compiler import is_dynamo_compiling

from . import debug_checks

Cache = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def _split_cache(cache: Cache, name: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(K, V) for a tuple cache; (stacked, None) for one 5-D tensor, which the op takes whole."""
    if isinstance(cache, torch.Tensor):
        return cache, None
    if isinstance(cache, (tuple, list)) and len(cache) == 2:
        return cache[0], cache[1]
    raise TypeError(f"nvfp4kv: {name} must be a tensor or a (K, V) tuple of two "
                    f"tensors, got {type(cache).__name__}" +
                    (f" of length {len(cache)}" if isinstance(cache, (tuple, list)) else ""))


Scale = Union[float, torch.Tensor]


def _scale_argument(op: str, name: str, scale) -> Tuple[float, Optional[torch.Tensor]]:
    """(value, tensor) as the op takes a global scale: a real number (not a bool), or a tensor."""
    if isinstance(scale, torch.Tensor):
        return 1.0, scale
    if isinstance(scale, (torch.SymFloat, torch.SymInt)):
        return scale, None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"nvfp4kv.{op}: {name} must be a float or a one-element float32 tensor, got "
                        f"{type(scale).__name__}")
    return float(scale), None


def _check_python_types(op: str, tensors, strings) -> None:
    """TypeError naming the first argument of the wrong Python type (the op's own parser would raise a
    RuntimeError naming its schema instead)."""
    for name, value in tensors:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"nvfp4kv.{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in strings:
        if not isinstance(value, str):
            raise TypeError(f"nvfp4kv.{op}: {name} must be a str, got {type(value).__name__}")


def _op_arguments(op: str, paged_kv_cache: Cache, kv_cache_sf: Cache, k_scale: Scale, v_scale: Scale) -> tuple:
    """(k_cache, v_cache, k_cache_sf, v_cache_sf, k_scale, v_scale, k_scale_tensor, v_scale_tensor) as the
    ops take them."""
    k_cache, v_cache = _split_cache(paged_kv_cache, "paged_kv_cache")
    k_sf, v_sf = _split_cache(kv_cache_sf, "kv_cache_sf")
    k_value, k_tensor = _scale_argument(op, "k_scale", k_scale)
    v_value, v_tensor = _scale_argument(op, "v_scale", v_scale)
    return k_cache, v_cache, k_sf, v_sf, k_value, v_value, k_tensor, v_tensor


def _cache_names(caches) -> Tuple[str, ...]:
    """The user's names of (k_cache, v_cache, k_cache_sf, v_cache_sf): tuple elements, or the stacked tensors."""
    return _CACHE_NAMES if caches[1] is not None else ("paged_kv_cache", "", "kv_cache_sf", "")


def _writable(op: str, caches) -> None:
    """Outside inference mode torch refuses in-place writes to inference tensors, and so do the appends."""
    if _inference_mode_enabled():
        return
    for name, cache in zip(_cache_names(caches), caches):
        if cache is not None and cache.is_inference():
            raise RuntimeError(f"nvfp4kv.{op}: {name} is an inference tensor; an in-place update to an inference "
                               "tensor outside InferenceMode is not allowed (make a clone first)")


_CACHE_NAMES = ("paged_kv_cache[0]", "paged_kv_cache[1]", "kv_cache_sf[0]", "kv_cache_sf[1]")
_inference_mode_enabled = torch.is_inference_mode_enabled
# The kernels write through data pointers, so the wrapper bumps the caches' version counters as torch's
# in-place ops do (autograd then refuses stale saved tensors). Calls through torch.ops skip it.
_increment_version = torch._C._increment_version

# Eagerly the API calls an overload's C++ entry point (_op), skipping OpOverload.__call__'s Python frame;
# TorchDynamo (torch.compile, strict export) cannot trace _op and gets the OpOverload itself.
_APPEND = torch.ops.nvfp4kv.append_paged_kv_cache.default
_APPEND_WITH_SLOT_MAPPING = torch.ops.nvfp4kv.append_paged_kv_cache_with_slot_mapping.default
_APPEND_OP = _APPEND._op
_APPEND_WITH_SLOT_MAPPING_OP = _APPEND_WITH_SLOT_MAPPING._op
_OP = "append_paged_kv_cache"
_OP_WITH_SLOT_MAPPING = "append_paged_kv_cache_with_slot_mapping"


def nvfp4_quantize_append_paged_kv_cache(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    paged_kv_cache: Cache,
    kv_cache_sf: Cache,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    *,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> None:
    """Quantize and append K/V rows into an NVFP4 paged KV cache (in place).

    append_key / append_value: [nnz, num_kv_heads, head_dim], float16 or bfloat16.
    paged_kv_cache: (k_cache, v_cache) uint8 [max_num_pages, page_size, num_kv_heads, head_dim // 2]
        (NHD) or [max_num_pages, num_kv_heads, page_size, head_dim // 2] (HND), or one 5-D tensor with
        K/V on dim 1. kv_cache_sf: the same with float8_e4m3fn and head_dim // 16.
    k_scale / v_scale: global decode scales (value = e2m1 * block_scale * global_scale), as floats or
        one-element float32 tensors on the inputs' device.
    Row i of request batch_indices[i] at logical position positions[i] goes to page
    kv_indices[kv_indptr[b] + p // page_size], entry p % page_size. See docs/SPEC.md for the bit recipe.
    v_sf_layout: "linear" (FA2/XQA kernels) or "trtllm" (V scales 4-token interleaved, for trtllm-gen).
    scale_search: "none" (SPEC) or "4over6" (per block, the 4-targeted scale when it has less error).
    """
    # The call of every layer of every decode step: (K, V) tuples, float scales, eager, no debug checks.
    if type(paged_kv_cache) is tuple and type(kv_cache_sf) is tuple and type(k_scale) is float and \
            type(v_scale) is float and type(kv_layout) is str and len(paged_kv_cache) == 2 and \
            len(kv_cache_sf) == 2 and not debug_checks.ENABLED and not is_dynamo_compiling():
        caches = (*paged_kv_cache, *kv_cache_sf)
        _writable(_OP, caches)
        try:
            if v_sf_layout == "linear" and scale_search == "none":  # the schema's defaults: ~4% less to parse
                _APPEND_OP(append_key, append_value, batch_indices, positions, *caches, kv_indices, kv_indptr,
                           kv_last_page_len, k_scale, v_scale, kv_layout)
            else:
                _APPEND_OP(append_key, append_value, batch_indices, positions, *caches, kv_indices, kv_indptr,
                           kv_last_page_len, k_scale, v_scale, kv_layout, None, None, v_sf_layout, scale_search)
        except (TypeError, RuntimeError):
            _check_append_types(append_key, append_value, batch_indices, positions, caches, kv_indices,
                                kv_indptr, kv_last_page_len, kv_layout, v_sf_layout, scale_search)
            raise
        _increment_version(caches)
        return
    k_cache, v_cache, k_sf, v_sf, k_value, v_value, k_tensor, v_tensor = _op_arguments(
        _OP, paged_kv_cache, kv_cache_sf, k_scale, v_scale)
    caches = (k_cache, v_cache, k_sf, v_sf)
    _check_append_types(append_key, append_value, batch_indices, positions, caches, kv_indices, kv_indptr,
                        kv_last_page_len, kv_layout, v_sf_layout, scale_search)
    if is_dynamo_compiling():
        if debug_checks.ENABLED:  # checked by an op of its own at run time (the index data is device data)
            batch_indices = debug_checks.checked_batch_indices(
                batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, k_tensor, v_tensor,
                *debug_checks.page_geometry(k_cache, v_cache, kv_layout))
        _APPEND(append_key, append_value, batch_indices, positions, k_cache, v_cache, k_sf, v_sf, kv_indices,
                kv_indptr, kv_last_page_len, k_value, v_value, kv_layout, k_tensor, v_tensor, v_sf_layout,
                scale_search)
        return
    _writable(_OP, caches)
    if debug_checks.ENABLED:
        debug_checks.check_append(append_key, append_value, batch_indices, positions, k_cache, v_cache, k_sf, v_sf,
                                  kv_indices, kv_indptr, kv_last_page_len, k_value, v_value, kv_layout, k_tensor,
                                  v_tensor, v_sf_layout, scale_search)
    _APPEND_OP(append_key, append_value, batch_indices, positions, k_cache, v_cache, k_sf, v_sf, kv_indices,
               kv_indptr, kv_last_page_len, k_value, v_value, kv_layout, k_tensor, v_tensor, v_sf_layout,
               scale_search)
    _increment_version([c for c in caches if c is not None])


def _check_append_types(append_key, append_value, batch_indices, positions, caches, kv_indices, kv_indptr,
                        kv_last_page_len, kv_layout, v_sf_layout, scale_search) -> None:
    _check_python_types(_OP, (("append_key", append_key), ("append_value", append_value),
                              ("batch_indices", batch_indices), ("positions", positions), *zip(_cache_names(caches), caches),
                              ("kv_indices", kv_indices), ("kv_indptr", kv_indptr),
                              ("kv_last_page_len", kv_last_page_len)),
                        (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search)))


def nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
    append_key: torch.Tensor,
    append_value: torch.Tensor,
    slot_mapping: torch.Tensor,
    paged_kv_cache: Cache,
    kv_cache_sf: Cache,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    *,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> None:
    """The same append, addressed by flat slots as vLLM-style engines do.

    slot_mapping: [n] int32/int64 with n <= append_key.shape[0]; row i goes to page
    slot_mapping[i] // page_size, entry slot_mapping[i] % page_size. Negative slots are padding
    (skipped), and so are slots at or beyond max_num_pages * page_size. Rows past n are ignored.
    """
    if type(paged_kv_cache) is tuple and type(kv_cache_sf) is tuple and type(k_scale) is float and \
            type(v_scale) is float and type(kv_layout) is str and len(paged_kv_cache) == 2 and \
            len(kv_cache_sf) == 2 and not debug_checks.ENABLED and not is_dynamo_compiling():
        caches = (*paged_kv_cache, *kv_cache_sf)
        _writable(_OP_WITH_SLOT_MAPPING, caches)
        try:
            if v_sf_layout == "linear" and scale_search == "none":
                _APPEND_WITH_SLOT_MAPPING_OP(append_key, append_value, slot_mapping, *caches, k_scale, v_scale,
                                             kv_layout)
            else:
                _APPEND_WITH_SLOT_MAPPING_OP(append_key, append_value, slot_mapping, *caches, k_scale, v_scale,
                                             kv_layout, None, None, v_sf_layout, scale_search)
        except (TypeError, RuntimeError):
            _check_slot_mapping_types(append_key, append_value, slot_mapping, caches, kv_layout, v_sf_layout,
                                      scale_search)
            raise
        _increment_version(caches)
        return
    k_cache, v_cache, k_sf, v_sf, k_value, v_value, k_tensor, v_tensor = _op_arguments(
        _OP_WITH_SLOT_MAPPING, paged_kv_cache, kv_cache_sf, k_scale, v_scale)
    caches = (k_cache, v_cache, k_sf, v_sf)
    _check_slot_mapping_types(append_key, append_value, slot_mapping, caches, kv_layout, v_sf_layout, scale_search)
    if is_dynamo_compiling():
        if debug_checks.ENABLED:
            slot_mapping = debug_checks.checked_slot_mapping(slot_mapping, k_tensor, v_tensor,
                                                             *debug_checks.page_geometry(k_cache, v_cache, kv_layout))
        _APPEND_WITH_SLOT_MAPPING(append_key, append_value, slot_mapping, k_cache, v_cache, k_sf, v_sf, k_value,
                                  v_value, kv_layout, k_tensor, v_tensor, v_sf_layout, scale_search)
        return
    _writable(_OP_WITH_SLOT_MAPPING, caches)
    if debug_checks.ENABLED:
        debug_checks.check_append_with_slot_mapping(append_key, append_value, slot_mapping, k_cache, v_cache, k_sf,
                                                    v_sf, k_value, v_value, kv_layout, k_tensor, v_tensor,
                                                    v_sf_layout, scale_search)
    _APPEND_WITH_SLOT_MAPPING_OP(append_key, append_value, slot_mapping, k_cache, v_cache, k_sf, v_sf, k_value,
                                 v_value, kv_layout, k_tensor, v_tensor, v_sf_layout, scale_search)
    _increment_version([c for c in caches if c is not None])


def _check_slot_mapping_types(append_key, append_value, slot_mapping, caches, kv_layout, v_sf_layout,
                              scale_search) -> None:
    _check_python_types(_OP_WITH_SLOT_MAPPING, (("append_key", append_key), ("append_value", append_value),
                                                ("slot_mapping", slot_mapping), *zip(_cache_names(caches), caches)),
                        (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search)))


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Sequence length of each request: full pages times page_size plus the last page's entries."""
    full_pages = torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0)
    return full_pages * page_size + kv_last_page_len


def get_batch_indices_positions(
    append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """int32 (batch_indices, positions) of the nnz appended rows.

    Row j of request b (append_indptr[b] <= j < append_indptr[b+1]) gets b and
    seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + (j - append_indptr[b]).
    Runs on the inputs' device without synchronising (nnz is given), so it can be captured.
    """
    device = append_indptr.device
    counts = append_indptr[1:] - append_indptr[:-1]
    batch = torch.arange(counts.numel(), device=device)
    batch_indices = torch.repeat_interleave(batch, counts, output_size=nnz)
    rows = torch.arange(nnz, device=device)
    first_position = seq_lens.to(counts.dtype) - counts
    positions = first_position[batch_indices] + rows - append_indptr[:-1][batch_indices]
    return batch_indices.to(torch.int32), positions.to(torch.int32)


def dequantize_paged_kv_cache(
    paged_kv_cache: Cache,
    kv_cache_sf: Cache,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    v_sf_layout: str = "linear",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ragged K and V [total_tokens, num_kv_heads, head_dim] of all requests in order (request 0's
    tokens first), dequantized from the paged NVFP4 cache: what a non-FP4 attention kernel or a
    debugger needs. Reads the total token count to the host (one synchronisation)."""
    k_cache, v_cache = _split_cache(paged_kv_cache, "paged_kv_cache")
    k_sf, v_sf = _split_cache(kv_cache_sf, "kv_cache_sf")
    if v_cache is None:
        k_cache, v_cache = k_cache[:, 0], k_cache[:, 1]
    if v_sf is None:
        k_sf, v_sf = k_sf[:, 0], k_sf[:, 1]
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f'nvfp4kv.dequantize_paged_kv_cache: kv_layout must be "NHD" or "HND", got "{kv_layout}"')
    if v_sf_layout != "linear":
        v_sf = convert_v_scale_layout(v_sf, src=v_sf_layout, dst="linear", kv_layout=kv_layout)
    page_size = k_cache.shape[1 if kv_layout == "NHD" else 2]
    seq_lens = get_seq_lens(kv_indptr, kv_last_page_len, page_size)
    append_indptr = torch.cat([seq_lens.new_zeros(1), torch.cumsum(seq_lens, 0)])
    total = int(append_indptr[-1])
    batch_indices, positions = get_batch_indices_positions(append_indptr, seq_lens, total)
    slots = kv_indptr.long()[batch_indices.long()] + positions.long() // page_size
    pages = kv_indices.long()[slots]
    entries = positions.long() % page_size

    def gather(cache: torch.Tensor) -> torch.Tensor:  # -> [total, heads, width]
        return cache[pages, entries] if kv_layout == "NHD" else cache[pages, :, entries]

    def read(cache: torch.Tensor, sf: torch.Tensor, scale: Scale) -> torch.Tensor:
        if isinstance(scale, torch.Tensor):
            # (e2m1 * sf) * 1.0 is exact, so multiplying by the tensor afterwards rounds exactly as
            # the op's (e2m1 * sf) * s does.
            return (torch.ops.nvfp4kv.dequantize(gather(cache), gather(sf), 1.0) * scale).to(out_dtype)
        return torch.ops.nvfp4kv.dequantize(gather(cache), gather(sf), scale).to(out_dtype)

    return read(k_cache, k_sf, k_scale), read(v_cache, v_sf, v_scale)


def convert_v_scale_layout(v_sf: torch.Tensor, src: str = "linear", dst: str = "trtllm", kv_layout: str = "NHD",
                           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rewrites a V-scale cache [pages, T, H, S] (NHD) or [pages, H, T, S] (HND) between the "linear"
    and "trtllm" layouts (both directions; T = page_size, S = head_dim / 16). Returns a new tensor, or
    writes into `out` (which may be v_sf itself: in place). In "trtllm" each (page, head) tile of T x S
    bytes is the C-order [T/4][S][4] array indexed [t // 4][j][t % 4]; NHD stores the tile's rows at
    [page, row, head, :]. Runs on v_sf's device (CPU or CUDA) with plain tensor operations.
    """
    name = "nvfp4kv.convert_v_scale_layout"
    layouts = ("linear", "trtllm")
    if src not in layouts or dst not in layouts:
        raise ValueError(f'{name}: src and dst must be "linear" or "trtllm", got "{src}" and "{dst}"')
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f'{name}: kv_layout must be "NHD" or "HND", got "{kv_layout}"')
    if v_sf.dim() != 4:
        raise ValueError(f"{name}: v_sf must be a 4-D scale cache, got shape {list(v_sf.shape)}")
    tiles = v_sf if kv_layout == "HND" else v_sf.transpose(1, 2)  # [pages, H, T, S]
    pages, heads, page_size, blocks = tiles.shape
    if page_size % 4 != 0 or blocks % 4 != 0:
        raise ValueError(f"{name}: the trtllm layout needs page_size % 4 == 0 and head_dim % 64 == 0, got "
                         f"page_size {page_size} and head_dim {blocks * 16}")
    if out is not None and (out.shape != v_sf.shape or out.dtype != v_sf.dtype or out.device != v_sf.device):
        raise ValueError(f"{name}: out must match v_sf ({list(v_sf.shape)}, {v_sf.dtype}, {v_sf.device}), got "
                         f"{list(out.shape)}, {out.dtype}, {out.device}")
    raw = tiles.contiguous().view(torch.uint8) if tiles.dtype != torch.uint8 else tiles.contiguous()
    if src == dst:
        converted = raw
    elif dst == "trtllm":  # [.., T/4, 4, S] -> [.., T/4, S, 4]
        converted = raw.reshape(pages, heads, page_size // 4, 4, blocks).transpose(-1, -2).reshape(
            pages, heads, page_size, blocks)
    else:  # [.., T/4, S, 4] -> [.., T/4, 4, S]
        converted = raw.reshape(pages, heads, page_size // 4, blocks, 4).transpose(-1, -2).reshape(
            pages, heads, page_size, blocks)
    converted = converted.view(v_sf.dtype)
    if kv_layout == "NHD":
        converted = converted.transpose(1, 2)
    if out is None:
        return converted.contiguous()
    return out.copy_(converted)
