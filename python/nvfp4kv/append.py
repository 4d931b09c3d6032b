"""The appends of the FlashInfer-compatible API (flashinfer.page.nvfp4_quantize_append_paged_kv_cache and the
slot-mapping variant): Python argument forms in, one call of the dispatcher op out."""

from __future__ import annotations

from typing import Tuple

import torch
from torch.compiler import is_dynamo_compiling

from . import debug_checks
from .arguments import Cache, Scale, check_python_types, four_over_six_scale_search, scale_argument, split_cache
from .fake import refuse_shared_storage

# Eagerly the API calls an overload's C++ entry point (_op), skipping OpOverload.__call__'s Python frame;
# TorchDynamo (torch.compile, strict export) cannot trace _op and gets the OpOverload itself.
_APPEND = torch.ops.nvfp4kv.append_paged_kv_cache.default
_APPEND_WITH_SLOT_MAPPING = torch.ops.nvfp4kv.append_paged_kv_cache_with_slot_mapping.default
_APPEND_OP = _APPEND._op
_APPEND_WITH_SLOT_MAPPING_OP = _APPEND_WITH_SLOT_MAPPING._op
_CACHE_NAMES = ("paged_kv_cache[0]", "paged_kv_cache[1]", "kv_cache_sf[0]", "kv_cache_sf[1]")
_STACKED_NAMES = ("paged_kv_cache", "", "kv_cache_sf", "")


def _op_caches_and_scales(op: str, paged_kv_cache: Cache, kv_cache_sf: Cache, k_scale: Scale, v_scale: Scale):
    """((k_cache, v_cache, k_cache_sf, v_cache_sf), (k_scale, v_scale), (k_scale_tensor, v_scale_tensor))."""
    k_cache, v_cache = split_cache(paged_kv_cache, "paged_kv_cache")
    k_sf, v_sf = split_cache(kv_cache_sf, "kv_cache_sf")
    k_value, k_tensor = scale_argument(op, "k_scale", k_scale)
    v_value, v_tensor = scale_argument(op, "v_scale", v_scale)
    return (k_cache, v_cache, k_sf, v_sf), (k_value, v_value), (k_tensor, v_tensor)


def _page_table_tensors(append_key, append_value, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len):
    return (("append_key", append_key), ("append_value", append_value), ("batch_indices", batch_indices),
            ("positions", positions), ("kv_indices", kv_indices), ("kv_indptr", kv_indptr),
            ("kv_last_page_len", kv_last_page_len))  # fmt: skip


def _slot_tensors(append_key, append_value, slot_mapping):
    return (("append_key", append_key), ("append_value", append_value), ("slot_mapping", slot_mapping))


def _same_base(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are views of one base tensor (or one is the other's base): what TorchDynamo can
    trace of storage sharing."""
    return (a if a._base is None else a._base) is (b if b._base is None else b._base)


def _refuse_shared_storage_when_traced(op: str, caches, named_tensors) -> None:
    names = _CACHE_NAMES if caches[1] is not None else _STACKED_NAMES
    refuse_shared_storage(op, list(zip(caches, names)), named_tensors, _same_base)


def _check_types(op: str, named_tensors: Tuple[Tuple[str, object], ...], caches, kv_layout, v_sf_layout,
                 scale_search) -> None:  # fmt: skip
    names = _CACHE_NAMES if caches[1] is not None else _STACKED_NAMES
    strings = (("kv_layout", kv_layout), ("v_sf_layout", v_sf_layout), ("scale_search", scale_search))
    check_python_types(op, (*named_tensors, *zip(names, caches)), strings)


def debug_checked_batch_indices(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, caches,
                                scale_tensors, kv_layout: str):  # fmt: skip
    """Debug mode's check of the page-table index data: on the host eagerly, by an op of its own at run time when
    traced (the index data is device data); returns the batch indices the append then reads."""
    page_geometry = debug_checks.page_geometry(caches[0], caches[1], kv_layout)
    if is_dynamo_compiling():
        return debug_checks.checked_batch_indices(
            batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, *scale_tensors, *page_geometry
        )
    debug_checks.check_index_data(
        batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, *scale_tensors, *page_geometry
    )
    return batch_indices


def debug_checked_slot_mapping(slot_mapping, caches, scale_tensors, kv_layout: str):
    """debug_checked_batch_indices for the slot mapping."""
    page_geometry = debug_checks.page_geometry(caches[0], caches[1], kv_layout)
    if is_dynamo_compiling():
        return debug_checks.checked_slot_mapping(slot_mapping, *scale_tensors, *page_geometry)
    debug_checks.check_slot_data(slot_mapping, *scale_tensors, *page_geometry)
    return slot_mapping


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
        one-element float32 tensors on the inputs' device (or on the CPU, read on the host like a float,
        with CUDA inputs outside graph capture).
    Row i of request batch_indices[i] at logical position positions[i] goes to page
    kv_indices[kv_indptr[b] + p // page_size], entry p % page_size. See docs/SPEC.md for the bit recipe.
    v_sf_layout: "linear" (FA2/XQA kernels) or "trtllm" (V scales 4-token interleaved, for trtllm-gen).
    scale_search: "none" (SPEC) or "4over6" (per block, the 4-targeted scale when it has less error).
    """
    op = "append_paged_kv_cache"
    # The call of every layer of every decode step: (K, V) tuples, float scales, eager, no debug checks. Written
    # out here (no helper calls, no *args) since Python's call overhead is a measurable part of the host time;
    # exact-type tests, as isinstance against torch.Tensor is slow when it fails (and torch's parser takes bytes
    # for a str).
    if (type(paged_kv_cache) is tuple and type(kv_cache_sf) is tuple and type(k_scale) is float
            and type(v_scale) is float and type(kv_layout) is str and len(paged_kv_cache) == 2
            and len(kv_cache_sf) == 2 and not debug_checks.ENABLED and not is_dynamo_compiling()):  # fmt: skip
        k, v = paged_kv_cache
        k_sf, v_sf = kv_cache_sf
        try:
            if v_sf_layout == "linear" and scale_search == "none":  # the schema's defaults: less for torch to parse
                _APPEND_OP(append_key, append_value, batch_indices, positions, k, v, k_sf, v_sf, kv_indices,
                           kv_indptr, kv_last_page_len, k_scale, v_scale, kv_layout)  # fmt: skip
            else:
                _APPEND_OP(append_key, append_value, batch_indices, positions, k, v, k_sf, v_sf, kv_indices,
                           kv_indptr, kv_last_page_len, k_scale, v_scale, kv_layout, None, None, v_sf_layout,
                           scale_search)  # fmt: skip
        except (TypeError, RuntimeError):
            _check_types(
                op,
                _page_table_tensors(
                    append_key, append_value, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len
                ),
                (k, v, k_sf, v_sf),
                kv_layout,
                v_sf_layout,
                scale_search,
            )
            raise
        return
    caches, scales, scale_tensors = _op_caches_and_scales(op, paged_kv_cache, kv_cache_sf, k_scale, v_scale)
    named = _page_table_tensors(append_key, append_value, batch_indices, positions, kv_indices, kv_indptr,
                                kv_last_page_len)  # fmt: skip
    _check_types(op, named, caches, kv_layout, v_sf_layout, scale_search)
    if is_dynamo_compiling():
        _refuse_shared_storage_when_traced(op, caches, (*named, *zip(("k_scale", "v_scale"), scale_tensors)))
    if debug_checks.ENABLED:
        batch_indices = debug_checked_batch_indices(
            batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, caches, scale_tensors, kv_layout
        )
    append = _APPEND if is_dynamo_compiling() else _APPEND_OP
    append(append_key, append_value, batch_indices, positions, *caches, kv_indices, kv_indptr, kv_last_page_len,
           *scales, kv_layout, *scale_tensors, v_sf_layout, scale_search)  # fmt: skip


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
    nvfp4_4over6=None,
) -> None:
    """The same append, addressed by flat slots as vLLM-style engines do.

    slot_mapping: [n] int32/int64 with n <= append_key.shape[0]; row i goes to page
    slot_mapping[i] // page_size, entry slot_mapping[i] % page_size. Negative slots are padding
    (skipped), and so are slots at or beyond max_num_pages * page_size. Rows past n are ignored.
    nvfp4_4over6: FlashInfer's 4-over-6 config (None: off). NVFP44Over6Config(err_mode="mse") (e4m3_max 448,
    err_use_fast_math False) is scale_search="4over6"; other configs raise ValueError naming the field.
    """
    op = "append_paged_kv_cache_with_slot_mapping"
    if (type(paged_kv_cache) is tuple and type(kv_cache_sf) is tuple and type(k_scale) is float
            and type(v_scale) is float and type(kv_layout) is str and len(paged_kv_cache) == 2
            and len(kv_cache_sf) == 2 and nvfp4_4over6 is None and not debug_checks.ENABLED
            and not is_dynamo_compiling()):  # fmt: skip
        k, v = paged_kv_cache
        k_sf, v_sf = kv_cache_sf
        try:
            if v_sf_layout == "linear" and scale_search == "none":
                _APPEND_WITH_SLOT_MAPPING_OP(append_key, append_value, slot_mapping, k, v, k_sf, v_sf, k_scale,
                                             v_scale, kv_layout)  # fmt: skip
            else:
                _APPEND_WITH_SLOT_MAPPING_OP(append_key, append_value, slot_mapping, k, v, k_sf, v_sf, k_scale,
                                             v_scale, kv_layout, None, None, v_sf_layout, scale_search)  # fmt: skip
        except (TypeError, RuntimeError):
            _check_types(
                op,
                _slot_tensors(append_key, append_value, slot_mapping),
                (k, v, k_sf, v_sf),
                kv_layout,
                v_sf_layout,
                scale_search,
            )
            raise
        return
    scale_search = four_over_six_scale_search(op, nvfp4_4over6, scale_search)
    caches, scales, scale_tensors = _op_caches_and_scales(op, paged_kv_cache, kv_cache_sf, k_scale, v_scale)
    named = _slot_tensors(append_key, append_value, slot_mapping)
    _check_types(op, named, caches, kv_layout, v_sf_layout, scale_search)
    if is_dynamo_compiling():
        _refuse_shared_storage_when_traced(op, caches, (*named, *zip(("k_scale", "v_scale"), scale_tensors)))
    if debug_checks.ENABLED:
        slot_mapping = debug_checked_slot_mapping(slot_mapping, caches, scale_tensors, kv_layout)
    append = _APPEND_WITH_SLOT_MAPPING if is_dynamo_compiling() else _APPEND_WITH_SLOT_MAPPING_OP
    append(append_key, append_value, slot_mapping, *caches, *scales, kv_layout, *scale_tensors, v_sf_layout,
           scale_search)  # fmt: skip
