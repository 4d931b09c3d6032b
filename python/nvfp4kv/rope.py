"""The fused rotary embedding + NVFP4 append (docs/SPEC.md section 5): one kernel rotates Q and K, writes Q out
(in the input dtype or FP8 E4M3) and quantizes the rotated K and the V into the paged cache, with the bytes of
a reference RoPE followed by nvfp4_quantize_append_paged_kv_cache."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch.compiler import is_dynamo_compiling

from . import debug_checks
from .append import (
    _CACHE_NAMES,
    _STACKED_NAMES,
    _op_caches_and_scales,
    _same_base,
    debug_checked_batch_indices,
    debug_checked_slot_mapping,
)
from .arguments import Cache, Scale, check_python_types, scale_argument
from .fake import refuse_shared_storage

_ROPE = torch.ops.nvfp4kv.rope_append_paged_kv_cache.default
_ROPE_WITH_SLOT_MAPPING = torch.ops.nvfp4kv.rope_append_paged_kv_cache_with_slot_mapping.default
_Q_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def _q_arguments(op: str, query, q_out, q_out_dtype, q_scale) -> Tuple:
    """(query for the op, q_out, q_scale float or None, q_scale tensor or None). A fresh q_out of q_out_dtype
    (None: query's dtype) when none is given; q_out given as `query` itself rotates Q in place (the op then gets
    no separate query)."""
    if not isinstance(query, torch.Tensor):
        raise TypeError(f"nvfp4kv.{op}: query must be a torch.Tensor, got {type(query).__name__}")
    if q_out_dtype is not None and q_out_dtype not in _Q_OUT_DTYPES:
        raise ValueError(
            f"nvfp4kv.{op}: q_out_dtype must be None (query's dtype), query's dtype or torch.float8_e4m3fn, "
            f"got {q_out_dtype}"
        )
    if q_out is None:
        q_out = torch.empty(query.shape, dtype=q_out_dtype or query.dtype, device=query.device)
    elif not isinstance(q_out, torch.Tensor):
        raise TypeError(f"nvfp4kv.{op}: q_out must be None or a torch.Tensor, got {type(q_out).__name__}")
    elif q_out_dtype is not None and q_out.dtype != q_out_dtype:
        raise ValueError(f"nvfp4kv.{op}: q_out must have dtype q_out_dtype = {q_out_dtype}, got {q_out.dtype}")
    scale_value, scale_tensor = (None, None) if q_scale is None else scale_argument(op, "q_scale", q_scale)
    if scale_tensor is not None:
        scale_value = None
    return (None if q_out is query else query), q_out, scale_value, scale_tensor


def _page_table_tensors(key, value, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len):
    return (("key", key), ("value", value), ("batch_indices", batch_indices), ("positions", positions),
            ("kv_indices", kv_indices), ("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len))  # fmt: skip


def _checks(op: str, named, rotation, caches, scale_tensors, q_out, k_out, strings) -> None:
    """Python types (`strings`: the (name, value) str arguments), and while TorchDynamo traces, the shared-storage
    refusal for everything the op writes."""
    names = _CACHE_NAMES if caches[1] is not None else _STACKED_NAMES
    check_python_types(op, (*named, *rotation, ("q_out", q_out), ("k_out", k_out), *zip(names, caches)), strings)
    if is_dynamo_compiling():
        written = [*zip(caches, names), (q_out, "q_out"), (k_out, "k_out")]
        reads = [*named, *rotation, *zip(("k_scale", "v_scale", "q_scale"), scale_tensors)]
        refuse_shared_storage(op, written, reads, _same_base)


def rope_quantize_nvfp4_append_paged_kv_cache(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rope_positions: torch.Tensor,
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
    is_neox: bool = True,
    q_out: Optional[torch.Tensor] = None,
    q_out_dtype: Optional[torch.dtype] = None,
    q_scale: Optional[Scale] = None,
    k_out: Optional[torch.Tensor] = None,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> torch.Tensor:
    """Rotate Q and K (RoPE) and quantize-append the rotated K and the V into an NVFP4 paged cache, in one kernel.

    query [n, Hq, D], key / value [n, Hkv, D]: float16 or bfloat16, last dim contiguous (views of one packed qkv
    projection output are fine). cos_sin_cache [max_pos, R]: cos in the first R / 2 columns, sin in the rest;
    float32 (float16 / bfloat16 widened exactly); R even, R <= D: dims >= R are not rotated. rope_positions [n]:
    each row's table row; a row outside [0, max_pos) is not rotated, its Q (and k_out) row is zeros and its K/V
    are not cached. is_neox: pairs (j, j + R/2); False: GPT-J pairs (2j, 2j + 1).
    batch_indices / positions [nnz <= n] and the cache arguments as nvfp4_quantize_append_paged_kv_cache: rows
    i < nnz are cached, the rest (CUDA-graph padding) only rotated.
    q_out: [n, Hq, D] preallocated output, or `query` itself (in place); None: a new tensor of q_out_dtype (None:
    query's dtype, or torch.float8_e4m3fn). q_scale: the FP8 Q decode scale (float or one-element float32
    tensor), given exactly when Q goes out in FP8: byte = E4M3(q / q_scale). k_out: optional [n, Hkv, D] tensor
    of the input dtype receiving the rotated K. Returns q_out.
    """
    op = "rope_append_paged_kv_cache"
    # The call of every layer of every decode step: (K, V) tuples, float scales, eager, no debug checks. Written out
    # here (no helper calls), as in append.py: Python's call overhead is a measurable part of the host time.
    if (type(paged_kv_cache) is tuple and type(kv_cache_sf) is tuple and type(k_scale) is float
            and type(v_scale) is float and (q_scale is None or type(q_scale) is float) and type(kv_layout) is str
            and type(query) is torch.Tensor and len(paged_kv_cache) == 2 and len(kv_cache_sf) == 2
            and (q_out_dtype is None or (q_out is None and q_out_dtype in _Q_OUT_DTYPES))
            and not debug_checks.ENABLED and not is_dynamo_compiling()):  # fmt: skip
        k, v = paged_kv_cache
        k_sf, v_sf = kv_cache_sf
        if q_out is None:
            q_out = torch.empty(query.shape, dtype=q_out_dtype or query.dtype, device=query.device)
        try:
            _ROPE._op(key, value, batch_indices, positions, k, v, k_sf, v_sf, kv_indices, kv_indptr, kv_last_page_len,
                      k_scale, v_scale, kv_layout, None, None, v_sf_layout, scale_search,
                      None if q_out is query else query, cos_sin_cache, rope_positions, q_out, k_out, bool(is_neox),
                      q_scale, None)  # fmt: skip
        except (TypeError, RuntimeError):
            named = _page_table_tensors(key, value, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len)
            rotation = (("query", query), ("cos_sin_cache", cos_sin_cache), ("rope_positions", rope_positions))
            strings = (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search))
            _checks(op, named, rotation, (k, v, k_sf, v_sf), (None, None, None), q_out, k_out, strings)
            raise
        return q_out
    op_query, q_out, q_value, q_tensor = _q_arguments(op, query, q_out, q_out_dtype, q_scale)
    caches, scales, scale_tensors = _op_caches_and_scales(op, paged_kv_cache, kv_cache_sf, k_scale, v_scale)
    named = _page_table_tensors(key, value, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len)
    rotation = (("query", op_query), ("cos_sin_cache", cos_sin_cache), ("rope_positions", rope_positions))
    strings = (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search))
    _checks(op, named, rotation, caches, (*scale_tensors, q_tensor), q_out, k_out, strings)
    if debug_checks.ENABLED:
        batch_indices = debug_checked_batch_indices(
            batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, caches, scale_tensors, kv_layout
        )
    call = _ROPE if is_dynamo_compiling() else _ROPE._op
    call(key, value, batch_indices, positions, *caches, kv_indices, kv_indptr, kv_last_page_len, *scales, kv_layout,
         *scale_tensors, v_sf_layout, scale_search, op_query, cos_sin_cache, rope_positions, q_out, k_out,
         bool(is_neox), q_value, q_tensor)  # fmt: skip
    return q_out


def rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    rope_positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    paged_kv_cache: Cache,
    kv_cache_sf: Cache,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    *,
    is_neox: bool = True,
    q_out: Optional[torch.Tensor] = None,
    q_out_dtype: Optional[torch.dtype] = None,
    q_scale: Optional[Scale] = None,
    k_out: Optional[torch.Tensor] = None,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> torch.Tensor:
    """The same fused rotation and append, addressed by flat slots (vLLM style): slot_mapping [nnz <= n], row
    i < nnz goes to page slot // page_size, entry slot % page_size; negative slots (padding) and slots past the
    cache are skipped; rows >= nnz are only rotated. Returns q_out."""
    op = "rope_append_paged_kv_cache_with_slot_mapping"
    if (type(paged_kv_cache) is tuple and type(kv_cache_sf) is tuple and type(k_scale) is float
            and type(v_scale) is float and (q_scale is None or type(q_scale) is float) and type(kv_layout) is str
            and type(query) is torch.Tensor and len(paged_kv_cache) == 2 and len(kv_cache_sf) == 2
            and (q_out_dtype is None or (q_out is None and q_out_dtype in _Q_OUT_DTYPES))
            and not debug_checks.ENABLED and not is_dynamo_compiling()):  # fmt: skip
        k, v = paged_kv_cache
        k_sf, v_sf = kv_cache_sf
        if q_out is None:
            q_out = torch.empty(query.shape, dtype=q_out_dtype or query.dtype, device=query.device)
        try:
            op_query = None if q_out is query else query
            _ROPE_WITH_SLOT_MAPPING._op(key, value, slot_mapping, k, v, k_sf, v_sf, k_scale, v_scale, kv_layout, None,
                                        None, v_sf_layout, scale_search, op_query, cos_sin_cache, rope_positions,
                                        q_out, k_out, bool(is_neox), q_scale, None)  # fmt: skip
        except (TypeError, RuntimeError):
            named = (("key", key), ("value", value), ("slot_mapping", slot_mapping))
            rotation = (("query", query), ("cos_sin_cache", cos_sin_cache), ("rope_positions", rope_positions))
            strings = (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search))
            _checks(op, named, rotation, (k, v, k_sf, v_sf), (None, None, None), q_out, k_out, strings)
            raise
        return q_out
    op_query, q_out, q_value, q_tensor = _q_arguments(op, query, q_out, q_out_dtype, q_scale)
    caches, scales, scale_tensors = _op_caches_and_scales(op, paged_kv_cache, kv_cache_sf, k_scale, v_scale)
    named = (("key", key), ("value", value), ("slot_mapping", slot_mapping))
    rotation = (("query", op_query), ("cos_sin_cache", cos_sin_cache), ("rope_positions", rope_positions))
    strings = (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search))
    _checks(op, named, rotation, caches, (*scale_tensors, q_tensor), q_out, k_out, strings)
    if debug_checks.ENABLED:
        slot_mapping = debug_checked_slot_mapping(slot_mapping, caches, scale_tensors, kv_layout)
    call = _ROPE_WITH_SLOT_MAPPING if is_dynamo_compiling() else _ROPE_WITH_SLOT_MAPPING._op
    call(key, value, slot_mapping, *caches, *scales, kv_layout, *scale_tensors, v_sf_layout, scale_search, op_query,
         cos_sin_cache, rope_positions, q_out, k_out, bool(is_neox), q_value, q_tensor)  # fmt: skip
    return q_out
