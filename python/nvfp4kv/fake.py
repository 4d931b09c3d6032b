"""Fake (meta) implementations of the nvfp4kv ops, for torch.compile, export and meta tensors.

They only check metadata, with the same checks and messages as the C++ kernels
(cpp/src/append_checks.cpp, cpp/src/dequantize_arguments.cpp), so a traced call fails exactly
where an eager one would.
"""

from __future__ import annotations

import math
import struct
from typing import List, NamedTuple, Optional, Sequence, Tuple

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


def _strides(t: torch.Tensor) -> List[int]:
    """t's strides with those of size-1 dims read as 0, as the C++ TensorInfo reads them."""
    return [0 if size == 1 else stride for size, stride in zip(t.shape, t.stride())]


def _check_index(check: _Checker, t: torch.Tensor, name: str) -> None:
    if t.dtype not in _INDEX_DTYPES:
        check.fail(f"{name} must have dtype int32 or int64, got {_dtype(t.dtype)}")
    if t.dim() != 1:
        check.fail(f"{name} must be a 1-D tensor, got shape {_shape(t.shape)}")


class _Cache4(NamedTuple):
    """A 4-D cache tensor as the user named it (a stacked cache's K or V half: its 5-D tensor, the
    half's byte offset inside it, and dim 1 dropped)."""
    name: str
    sizes: List[int]
    strides: List[int]
    tensor: torch.Tensor
    byte_offset: int


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
        return (_Cache4(f"{name}[0]", list(first.shape), _strides(first), first, 0),
                _Cache4(f"{name}[1]", list(second.shape), _strides(second), second, 0))
    sizes = [first.shape[0], first.shape[2], first.shape[3], first.shape[4]]
    strides = [_strides(first)[d] for d in (0, 2, 3, 4)]
    return (_Cache4(name, sizes, strides, first, 0),
            _Cache4(name, list(sizes), list(strides), first, first.stride(1) * first.element_size()))


def _check_cache(check: _Checker, cache: _Cache4, dtype: torch.dtype, nhd: bool, num_heads: int, width: int,
                 reference: Optional[_Cache4]) -> None:
    name, sizes, strides = cache.name, cache.sizes, cache.strides
    entry_dim, head_dim = (1, 2) if nhd else (2, 1)
    expected: List[Optional[int]] = [None, None, None, width]
    if reference is not None:
        expected[0] = reference.sizes[0]
        expected[entry_dim] = reference.sizes[entry_dim]
    expected[head_dim] = num_heads
    if any(e is not None and s != e for s, e in zip(sizes, expected)):
        layout = "[max_num_pages, page_size, num_kv_heads, " if nhd else "[max_num_pages, num_kv_heads, page_size, "
        width_name = "head_dim/2]" if dtype == torch.uint8 else "head_dim/16]"
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        check.fail(f"{name} must have shape {layout}{width_name} = {want} for kv_layout "
                   f"{'NHD' if nhd else 'HND'}, got {_shape(sizes)}")
    if sizes[3] != 1 and strides[3] != 1:
        check.fail(f"{name} must be contiguous in its last dim (stride 1), got stride {strides[3]}")
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
                  trtllm) -> List[_Cache4]:
    data = _split_cache(check, k_cache, v_cache, "paged_kv_cache", torch.uint8)
    scales = _split_cache(check, k_cache_sf, v_cache_sf, "kv_cache_sf", torch.float8_e4m3fn)
    _check_cache(check, data[0], torch.uint8, nhd, num_heads, head_dim // 2, None)
    _check_cache(check, data[1], torch.uint8, nhd, num_heads, head_dim // 2, data[0])
    _check_cache(check, scales[0], torch.float8_e4m3fn, nhd, num_heads, head_dim // 16, data[0])
    _check_cache(check, scales[1], torch.float8_e4m3fn, nhd, num_heads, head_dim // 16, data[0])
    if trtllm:
        _check_trtllm_scales(check, scales, nhd, data[0].sizes[1 if nhd else 2], head_dim)
    written = [data[0], data[1], scales[0], scales[1]]
    _check_written_disjoint(check, written, v_cache is None)
    return written


def _check_trtllm_scales(check: _Checker, scales, nhd, page_size, head_dim) -> None:
    if page_size % 4 != 0:
        check.fail(f'v_sf_layout "trtllm" needs page_size % 4 == 0, got page_size {page_size}')
    if head_dim % 64 != 0:
        check.fail(f'v_sf_layout "trtllm" needs head_dim % 64 == 0, got head_dim {head_dim}')
    k, v = scales
    if v.strides != k.strides:
        check.fail(f'{v.name} must have the same strides as the K scales for v_sf_layout "trtllm", got '
                   f"{_shape(v.strides)} and {_shape(k.strides)}")
    blocks = head_dim // 16
    entry_stride, head_stride = (v.strides[1], v.strides[2]) if nhd else (v.strides[2], v.strides[1])
    if not nhd and entry_stride != blocks:
        check.fail(f"{v.name} must have contiguous [page_size, head_dim/16] tiles (entry stride {blocks}) for "
                   f'v_sf_layout "trtllm" and kv_layout HND, got entry stride {entry_stride}')
    if v.strides[0] % 16 != 0 or (not nhd and head_stride % 16 != 0):
        check.fail(f"{v.name} must have page{'' if nhd else ' and head'} strides that are multiples of 16 bytes "
                   f'for v_sf_layout "trtllm", got strides {_shape(v.strides)}')


# Aliasing: the C++ compares address ranges (cpp/src/memory_overlap.h); here the same ranges are byte
# offsets into a shared storage, compared only for tensors that share one.
def _byte_range(storage_offset: int, sizes, strides, itemsize: int) -> Tuple[int, int]:
    if any(size == 0 for size in sizes):
        return storage_offset, storage_offset
    last = sum((size - 1) * stride for size, stride in zip(sizes, strides))
    return storage_offset, storage_offset + (last + 1) * itemsize


def _cache_range(c: _Cache4) -> Tuple[int, int]:
    return _byte_range(c.tensor.storage_offset() * c.tensor.element_size() + c.byte_offset, c.sizes, c.strides, 1)


def _overlap(a: Tuple[int, int], b: Tuple[int, int]) -> bool:
    return a[0] < a[1] and b[0] < b[1] and a[0] < b[1] and b[0] < a[1]


def _overlap_bytes(a: Tuple[int, int], b: Tuple[int, int]) -> int:
    return min(a[1], b[1]) - max(a[0], b[0])


def _touches_each_byte_once(sizes, strides) -> bool:
    if any(size == 0 for size in sizes):
        return True
    span = 1
    for stride, size in sorted((st, sz) for sz, st in zip(sizes, strides) if sz > 1):
        if stride < span:
            return False
        span += stride * (size - 1)
    return True


def _disjoint_same_geometry(a: _Cache4, b: _Cache4) -> bool:
    if a.sizes != b.sizes or any(size > 1 and sa != sb for size, sa, sb in zip(a.sizes, a.strides, b.strides)):
        return False
    delta = abs(_cache_range(b)[0] - _cache_range(a)[0])
    return delta != 0 and _touches_each_byte_once(a.sizes + [2], a.strides + [delta])


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch._C._is_alias_of(a, b)


def _check_written_disjoint(check: _Checker, written: List[_Cache4], stacked: bool) -> None:
    for t in written:
        if not _touches_each_byte_once(t.sizes, t.strides):
            check.fail(f"{t.name} must not overlap itself (no stride-0 or expanded dims), got shape {_shape(t.sizes)} "
                       f"and strides {_shape(t.strides)}")
    for k, v in (written[0:2], written[2:4]):
        if _same_storage(k.tensor, v.tensor) and _overlap(_cache_range(k), _cache_range(v)) and \
                not _disjoint_same_geometry(k, v):
            if stacked:
                check.fail(f"{k.name} must hold K and V in separate memory (dim 1 must not be expanded), got a dim-1 "
                           f"stride of {v.byte_offset} bytes")
            check.fail(f"{v.name} must not overlap {k.name} in memory, got "
                       f"{_overlap_bytes(_cache_range(k), _cache_range(v))} overlapping bytes")
    for data in written[0:2]:
        for scales in written[2:4]:
            ranges = _cache_range(data), _cache_range(scales)
            if _same_storage(data.tensor, scales.tensor) and _overlap(*ranges):
                check.fail(f"{scales.name} must not overlap {data.name} in memory, got {_overlap_bytes(*ranges)} "
                           "overlapping bytes")


def _check_read_disjoint(check: _Checker, written: List[_Cache4], reads) -> None:
    for tensor, name in reads:
        if tensor is None:
            continue
        read = _byte_range(tensor.storage_offset() * tensor.element_size(), tensor.shape, _strides(tensor),
                           tensor.element_size())
        for t in written:
            if _same_storage(tensor, t.tensor) and _overlap(read, _cache_range(t)):
                check.fail(f"{name} must not overlap {t.name} in memory (the op writes there), got "
                           f"{_overlap_bytes(read, _cache_range(t))} overlapping bytes")


def _refuse_shared_storage_under_compile(check: _Checker, written: List[_Cache4], reads) -> None:
    """PyTorch's compiler mishandles mutated inputs that share a storage with another input (wrong
    bytes under dynamic shapes, failed compiles), so a traced call refuses them (eager calls take them)."""
    if not torch.compiler.is_compiling():
        return
    tensors = [(written[0].tensor, written[0].name)]
    for c in written[1:]:
        if c.tensor is not tensors[-1][0] or c.name != tensors[-1][1]:
            tensors.append((c.tensor, c.name))
    others = tensors + [(t, name) for t, name in reads if t is not None]
    for i, (cache, name) in enumerate(tensors):
        for other, other_name in others[i + 1:]:
            if _same_storage(cache, other):
                check.fail(f"{other_name} shares its storage with {name}; under torch.compile the caches must not share "
                           "a storage with each other or with another argument (PyTorch miscompiles mutated aliased "
                           "inputs): pass K and V as one stacked tensor [max_num_pages, 2, ...] or as separately "
                           "allocated tensors")


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
    written = _check_caches(check, k_cache, v_cache, k_cache_sf, v_cache_sf, nhd, num_heads, head_dim,
                            v_sf_layout == "trtllm")
    _check_scales(check, append_key, k_scale, v_scale, k_scale_tensor, v_scale_tensor)
    reads = [(append_key, "append_key"), (append_value, "append_value"), (batch_indices, "batch_indices"),
             (positions, "positions"), (kv_indices, "kv_indices"), (kv_indptr, "kv_indptr"),
             (kv_last_page_len, "kv_last_page_len"), (k_scale_tensor, "k_scale"), (v_scale_tensor, "v_scale")]
    _check_read_disjoint(check, written, reads)
    _refuse_shared_storage_under_compile(check, written, reads)


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
    written = _check_caches(check, k_cache, v_cache, k_cache_sf, v_cache_sf, nhd, num_heads, head_dim,
                            v_sf_layout == "trtllm")
    _check_scales(check, append_key, k_scale, v_scale, k_scale_tensor, v_scale_tensor)
    reads = [(append_key, "append_key"), (append_value, "append_value"), (slot_mapping, "slot_mapping"),
             (k_scale_tensor, "k_scale"), (v_scale_tensor, "v_scale")]
    _check_read_disjoint(check, written, reads)
    _refuse_shared_storage_under_compile(check, written, reads)


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
