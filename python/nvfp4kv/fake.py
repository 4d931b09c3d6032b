"""Fake (meta) implementations of the nvfp4kv ops, for torch.compile, export and meta tensors.

They only check metadata, with the same checks and messages as the C++ kernels
(cpp/src/append_checks.cpp, cpp/src/dequantize_arguments.cpp), so a traced call fails exactly
where an eager one would.
"""

from __future__ import annotations

import math
import struct
from typing import List, Optional, Sequence, Tuple

import torch

_INDEX_DTYPES = (torch.int32, torch.int64)


class _Checker:
    def __init__(self, op: str):
        self.op = op

    def fail(self, message: str) -> None:
        raise ValueError(f"nvfp4kv.{self.op}: {message}")


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(sizes: Sequence[int]) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def _device(t: torch.Tensor) -> str:
    return str(t.device)


def _as_float32(value: float) -> float:
    """value rounded to fp32 as C++ static_cast<float> does (overflow -> inf)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _global_scale(check: _Checker, name: str, scale: float) -> None:
    as_fp32 = _as_float32(float(scale))
    if not (as_fp32 > 0.0) or not math.isfinite(as_fp32):
        check.fail(f"{name} must be a positive finite float32 value, got {scale:g}")


def _check_index(check: _Checker, t: torch.Tensor, name: str) -> None:
    if t.dtype not in _INDEX_DTYPES:
        check.fail(f"{name} must have dtype int32 or int64, got {_dtype(t.dtype)}")
    if t.dim() != 1:
        check.fail(f"{name} must be a 1-D tensor, got shape {_shape(t.shape)}")


# A 4-D cache tensor as the user named it, as (name, sizes, last-dim stride).
_Cache4 = Tuple[str, List[int], int]


def _split_cache(check: _Checker, first: torch.Tensor, second: Optional[torch.Tensor], name: str,
                 dtype: torch.dtype) -> Tuple[_Cache4, _Cache4]:
    stacked = second is None
    parts = [first] if stacked else [first, second]
    for i, part in enumerate(parts):
        part_name = name if stacked else f"{name}[{i}]"
        if part.dtype != dtype:
            check.fail(f"{part_name} must have dtype {_dtype(dtype)}, got {_dtype(part.dtype)}")
        if stacked and (first.dim() != 5 or first.shape[1] != 2):
            check.fail(f"{part_name} as one tensor must be 5-D with K/V on dim 1 ([max_num_pages, 2, ...]), "
                       f"got shape {_shape(first.shape)}")
        if not stacked and part.dim() != 4:
            check.fail(f"{part_name} must be a 4-D tensor, got shape {_shape(part.shape)}")
    if not stacked:
        return ((f"{name}[0]", list(first.shape), first.stride(3)),
                (f"{name}[1]", list(second.shape), second.stride(3)))
    sizes = [first.shape[0], first.shape[2], first.shape[3], first.shape[4]]
    return (name, sizes, first.stride(4)), (name, list(sizes), first.stride(4))


def _check_cache(check: _Checker, cache: _Cache4, dtype: torch.dtype, nhd: bool, num_heads: int, width: int,
                 reference: Optional[_Cache4]) -> None:
    name, sizes, last_stride = cache
    entry_dim, head_dim = (1, 2) if nhd else (2, 1)
    expected: List[Optional[int]] = [None, None, None, width]
    if reference is not None:
        expected[0] = reference[1][0]
        expected[entry_dim] = reference[1][entry_dim]
    expected[head_dim] = num_heads
    if any(e is not None and s != e for s, e in zip(sizes, expected)):
        layout = "[max_num_pages, page_size, num_kv_heads, " if nhd else "[max_num_pages, num_kv_heads, page_size, "
        width_name = "head_dim/2]" if dtype == torch.uint8 else "head_dim/16]"
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        check.fail(f"{name} must have shape {layout}{width_name} = {want} for kv_layout "
                   f"{'NHD' if nhd else 'HND'}, got {_shape(sizes)}")
    if last_stride != 1:
        check.fail(f"{name} must be contiguous in its last dim (stride 1), got stride {last_stride}")
    if sizes[entry_dim] < 1:
        check.fail(f"{name} must have page_size >= 1, got shape {_shape(sizes)}")


def _check_format(check: _Checker, kv_layout, v_sf_layout, scale_search) -> bool:
    if kv_layout not in ("NHD", "HND"):
        check.fail(f'kv_layout must be "NHD" or "HND", got "{kv_layout}"')
    if v_sf_layout not in ("linear", "trtllm"):
        check.fail(f'v_sf_layout must be "linear" or "trtllm", got "{v_sf_layout}"')
    if scale_search not in ("none", "4over6"):
        check.fail(f'scale_search must be "none" or "4over6", got "{scale_search}"')
    return kv_layout == "NHD"


def _check_rows_pair(check: _Checker, append_key, append_value) -> Tuple[int, int, int]:
    if append_key.dim() != 3:
        check.fail(f"append_key must be a 3-D tensor [nnz, num_kv_heads, head_dim], got shape "
                   f"{_shape(append_key.shape)}")
    dtype = append_key.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        check.fail(f"append_key must have dtype float16 or bfloat16, got {_dtype(dtype)}")
    nnz, num_heads, head_dim = append_key.shape
    if head_dim <= 0 or head_dim % 16 != 0:
        check.fail(f"append_key head_dim (last dim) must be a positive multiple of 16, got {head_dim}")
    if append_key.stride(2) != 1:
        check.fail(f"append_key must be contiguous in its last dim (stride 1), got stride {append_key.stride(2)}")
    if append_value.dim() != 3 or list(append_value.shape) != [nnz, num_heads, head_dim]:
        check.fail(f"append_value must have the same shape as append_key {_shape(append_key.shape)}, got "
                   f"{_shape(append_value.shape)}")
    if append_value.dtype != dtype:
        check.fail(f"append_value must have the same dtype as append_key ({_dtype(dtype)}), got "
                   f"{_dtype(append_value.dtype)}")
    if append_value.stride(2) != 1:
        check.fail(f"append_value must be contiguous in its last dim (stride 1), got stride "
                   f"{append_value.stride(2)}")
    return nnz, num_heads, head_dim


def _check_devices(check: _Checker, append_key, named) -> None:
    for tensor, name in named:
        if tensor is not None and tensor.device != append_key.device:
            check.fail(f"{name} must be on the same device as append_key ({_device(append_key)}), got "
                       f"{_device(tensor)}")


def _check_caches(check: _Checker, k_cache, v_cache, k_cache_sf, v_cache_sf, nhd, num_heads, head_dim,
                  trtllm) -> None:
    data = _split_cache(check, k_cache, v_cache, "paged_kv_cache", torch.uint8)
    scales = _split_cache(check, k_cache_sf, v_cache_sf, "kv_cache_sf", torch.float8_e4m3fn)
    _check_cache(check, data[0], torch.uint8, nhd, num_heads, head_dim // 2, None)
    _check_cache(check, data[1], torch.uint8, nhd, num_heads, head_dim // 2, data[0])
    _check_cache(check, scales[0], torch.float8_e4m3fn, nhd, num_heads, head_dim // 16, data[0])
    _check_cache(check, scales[1], torch.float8_e4m3fn, nhd, num_heads, head_dim // 16, data[0])
    if trtllm:
        _check_trtllm_scales(check, k_cache_sf, v_cache_sf, scales[1][0], nhd, data[0][1][1 if nhd else 2], head_dim)


def _check_trtllm_scales(check: _Checker, k_cache_sf, v_cache_sf, v_name, nhd, page_size, head_dim) -> None:
    if page_size % 4 != 0:
        check.fail(f'v_sf_layout "trtllm" needs page_size % 4 == 0, got page_size {page_size}')
    if head_dim % 64 != 0:
        check.fail(f'v_sf_layout "trtllm" needs head_dim % 64 == 0, got head_dim {head_dim}')
    if v_cache_sf is None:  # halves of one stacked tensor: strides without dim 1
        strides = [k_cache_sf.stride(d) for d in (0, 2, 3, 4)]
        k_strides = strides
    else:
        strides, k_strides = list(v_cache_sf.stride()), list(k_cache_sf.stride())
    if strides != k_strides:
        check.fail(f'{v_name} must have the same strides as the K scales for v_sf_layout "trtllm", got '
                   f"{_shape(strides)} and {_shape(k_strides)}")
    blocks = head_dim // 16
    entry_stride, head_stride = (strides[1], strides[2]) if nhd else (strides[2], strides[1])
    if not nhd and entry_stride != blocks:
        check.fail(f"{v_name} must have contiguous [page_size, head_dim/16] tiles (entry stride {blocks}) for "
                   f'v_sf_layout "trtllm" and kv_layout HND, got entry stride {entry_stride}')
    if strides[0] % 16 != 0 or (not nhd and head_stride % 16 != 0):
        check.fail(f"{v_name} must have page{'' if nhd else ' and head'} strides that are multiples of 16 bytes "
                   f'for v_sf_layout "trtllm", got strides {_shape(strides)}')


def _check_scales(check: _Checker, append_key, k_scale, v_scale, k_scale_tensor, v_scale_tensor) -> None:
    for name, value, tensor in (("k_scale", k_scale, k_scale_tensor), ("v_scale", v_scale, v_scale_tensor)):
        if tensor is None:
            _global_scale(check, name, value)
        elif tensor.dtype != torch.float32 or tensor.numel() != 1 or tensor.device != append_key.device:
            check.fail(f"{name} as a tensor must be a one-element float32 tensor on append_key's device "
                       f"({_device(append_key)}), got dtype {_dtype(tensor.dtype)}, shape {_shape(tensor.shape)}, "
                       f"device {_device(tensor)}")


def check_append_arguments(append_key, append_value, batch_indices, positions, k_cache, v_cache, k_cache_sf,
                           v_cache_sf, kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale,
                           kv_layout, k_scale_tensor=None, v_scale_tensor=None, v_sf_layout="linear",
                           scale_search="none") -> None:
    """The metadata checks of append_paged_kv_cache, in the C++ order, with the C++ messages."""
    check = _Checker("append_paged_kv_cache")
    nhd = _check_format(check, kv_layout, v_sf_layout, scale_search)
    nnz, num_heads, head_dim = _check_rows_pair(check, append_key, append_value)
    _check_devices(check, append_key, [
        (append_value, "append_value"), (batch_indices, "batch_indices"), (positions, "positions"),
        (k_cache, "paged_kv_cache"), (k_cache_sf, "kv_cache_sf"), (kv_indices, "kv_indices"),
        (kv_indptr, "kv_indptr"), (kv_last_page_len, "kv_last_page_len"), (v_cache, "paged_kv_cache[1]"),
        (v_cache_sf, "kv_cache_sf[1]")])
    for tensor, name in ((batch_indices, "batch_indices"), (positions, "positions"), (kv_indices, "kv_indices"),
                         (kv_indptr, "kv_indptr"), (kv_last_page_len, "kv_last_page_len")):
        _check_index(check, tensor, name)
    for tensor, name in ((batch_indices, "batch_indices"), (positions, "positions")):
        if tensor.shape[0] != nnz:
            check.fail(f"{name} must have nnz = {nnz} entries (append_key.shape[0]), got {tensor.shape[0]}")
    batch_size = kv_last_page_len.shape[0]
    if kv_indptr.shape[0] != batch_size + 1:
        check.fail(f"kv_indptr must have batch_size + 1 = {batch_size + 1} entries (batch_size = "
                   f"kv_last_page_len.shape[0]), got {kv_indptr.shape[0]}")
    _check_caches(check, k_cache, v_cache, k_cache_sf, v_cache_sf, nhd, num_heads, head_dim,
                  v_sf_layout == "trtllm")
    _check_scales(check, append_key, k_scale, v_scale, k_scale_tensor, v_scale_tensor)


def check_append_with_slot_mapping_arguments(append_key, append_value, slot_mapping, k_cache, v_cache, k_cache_sf,
                                             v_cache_sf, k_scale, v_scale, kv_layout, k_scale_tensor=None,
                                             v_scale_tensor=None, v_sf_layout="linear",
                                             scale_search="none") -> None:
    """The metadata checks of append_paged_kv_cache_with_slot_mapping, as in C++."""
    check = _Checker("append_paged_kv_cache_with_slot_mapping")
    nhd = _check_format(check, kv_layout, v_sf_layout, scale_search)
    nnz, num_heads, head_dim = _check_rows_pair(check, append_key, append_value)
    _check_devices(check, append_key, [
        (append_value, "append_value"), (slot_mapping, "slot_mapping"), (k_cache, "paged_kv_cache"),
        (k_cache_sf, "kv_cache_sf"), (v_cache, "paged_kv_cache[1]"), (v_cache_sf, "kv_cache_sf[1]")])
    _check_index(check, slot_mapping, "slot_mapping")
    if slot_mapping.shape[0] > nnz:
        check.fail(f"slot_mapping must have at most append_key.shape[0] = {nnz} entries, got "
                   f"{slot_mapping.shape[0]}")
    _check_caches(check, k_cache, v_cache, k_cache_sf, v_cache_sf, nhd, num_heads, head_dim,
                  v_sf_layout == "trtllm")
    _check_scales(check, append_key, k_scale, v_scale, k_scale_tensor, v_scale_tensor)


def check_dequantize_arguments(packed: torch.Tensor, scales: torch.Tensor, global_scale: float) -> None:
    """The metadata checks of dequantize, in the C++ order, with the C++ messages."""
    check = _Checker("dequantize")
    if packed.dtype != torch.uint8:
        check.fail(f"packed must have dtype uint8, got {_dtype(packed.dtype)}")
    if scales.dtype != torch.float8_e4m3fn:
        check.fail(f"scales must have dtype float8_e4m3fn, got {_dtype(scales.dtype)}")
    if packed.dim() < 1 or packed.shape[-1] % 8 != 0:
        check.fail(f"packed must have a last dim head_dim/2 that is a multiple of 8, got shape "
                   f"{_shape(packed.shape)}")
    if scales.dim() != packed.dim() or scales.shape[-1] * 8 != packed.shape[-1] or \
            list(scales.shape[:-1]) != list(packed.shape[:-1]):
        check.fail(f"scales must have shape [..., head_dim/16] matching packed {_shape(packed.shape)}, got "
                   f"{_shape(scales.shape)}")
    if scales.device != packed.device:
        check.fail(f"scales must be on the same device as packed ({_device(packed)}), got {_device(scales)}")
    _global_scale(check, "global_scale", global_scale)


@torch.library.register_fake("nvfp4kv::append_paged_kv_cache")
def _append_paged_kv_cache_fake(*args) -> None:
    check_append_arguments(*args)


@torch.library.register_fake("nvfp4kv::append_paged_kv_cache_with_slot_mapping")
def _append_paged_kv_cache_with_slot_mapping_fake(*args) -> None:
    check_append_with_slot_mapping_arguments(*args)


@torch.library.register_fake("nvfp4kv::dequantize")
def _dequantize_fake(packed, scales, global_scale):
    check_dequantize_arguments(packed, scales, global_scale)
    return packed.new_empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.float32)
