"""The MLA latent appends of the FlashInfer-compatible API (flashinfer.page.nvfp4_quantize_append_paged_mla_kv_cache
and the slot-mapping variant, docs/SPEC.md section 4): Python argument forms in, one call of the dispatcher op out."""

from __future__ import annotations

import torch
from torch.compiler import is_dynamo_compiling

from . import debug_checks
from .append import _same_base
from .arguments import Scale, check_python_types, scale_argument
from .fake import _MLA_ADVICE, _MLA_CACHE_NAMES, refuse_shared_storage

# Eagerly the API calls an overload's C++ entry point (_op); TorchDynamo gets the OpOverload itself.
_APPEND = torch.ops.nvfp4kv.append_paged_mla_kv_cache.default
_APPEND_WITH_SLOT_MAPPING = torch.ops.nvfp4kv.append_paged_mla_kv_cache_with_slot_mapping.default
_APPEND_OP = _APPEND._op
_APPEND_WITH_SLOT_MAPPING_OP = _APPEND_WITH_SLOT_MAPPING._op


def _page_table_tensors(append_ckv, append_kpe, batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len):
    return (("append_ckv", append_ckv), ("append_kpe", append_kpe), ("batch_indices", batch_indices),
            ("positions", positions), ("kv_indices", kv_indices), ("kv_indptr", kv_indptr),
            ("kv_last_page_len", kv_last_page_len))  # fmt: skip


def _slot_tensors(append_ckv, append_kpe, slot_mapping):
    return (("append_ckv", append_ckv), ("append_kpe", append_kpe), ("slot_mapping", slot_mapping))


def _check_types(op: str, named_tensors, caches) -> None:
    check_python_types(op, (*named_tensors, *zip(_MLA_CACHE_NAMES, caches)), ())


def _scales_and_checks(op: str, named_tensors, caches, ckv_scale: Scale, kpe_scale: Scale):
    """(ckv_scale, kpe_scale) floats and (ckv_scale_tensor, kpe_scale_tensor), after the Python type checks and,
    while TorchDynamo traces, the shared-storage refusal."""
    ckv_value, ckv_tensor = scale_argument(op, "ckv_scale", ckv_scale)
    kpe_value, kpe_tensor = scale_argument(op, "kpe_scale", kpe_scale)
    _check_types(op, named_tensors, caches)
    if is_dynamo_compiling():
        reads = (*named_tensors, ("ckv_scale", ckv_tensor), ("kpe_scale", kpe_tensor))
        refuse_shared_storage(op, list(zip(caches, _MLA_CACHE_NAMES)), reads, _same_base, _MLA_ADVICE)
    return (ckv_value, kpe_value), (ckv_tensor, kpe_tensor)


def _page_geometry(ckv_cache: torch.Tensor):
    """(max_num_pages, page_size) for the debug checks; (0, 0) for a malformed cache (the op names it)."""
    return (ckv_cache.shape[0], ckv_cache.shape[1]) if ckv_cache.dim() == 3 else (0, 0)


def nvfp4_quantize_append_paged_mla_kv_cache(
    append_ckv: torch.Tensor,
    append_kpe: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    ckv_cache: torch.Tensor,
    ckv_sf_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    ckv_scale: Scale,
    kpe_scale: Scale,
) -> None:
    """Quantize and append MLA latent rows into paged caches (in place).

    append_ckv [nnz, C] and append_kpe [nnz, R]: float16 or bfloat16, last dim contiguous, C % 16 == 0.
    ckv_cache uint8 [max_num_pages, page_size, C // 2], ckv_sf_cache float8_e4m3fn [.., C // 16]: NVFP4 ckv with
    global decode scale ckv_scale. kpe_cache float8_e4m3fn [.., R]: kpe / kpe_scale rounded to E4M3, or a cache
    of the inputs' dtype, which receives the kpe values as they are. Scales: floats or one-element float32
    tensors on the inputs' device (or the CPU, as for nvfp4_quantize_append_paged_kv_cache). Rows are placed as
    by nvfp4_quantize_append_paged_kv_cache (one head).
    """
    op = "append_paged_mla_kv_cache"
    if type(ckv_scale) is float and type(kpe_scale) is float and not debug_checks.ENABLED and not is_dynamo_compiling():
        try:
            _APPEND_OP(append_ckv, append_kpe, batch_indices, positions, ckv_cache, ckv_sf_cache, kpe_cache,
                       kv_indices, kv_indptr, kv_last_page_len, ckv_scale, kpe_scale)  # fmt: skip
        except (TypeError, RuntimeError):
            named = _page_table_tensors(append_ckv, append_kpe, batch_indices, positions, kv_indices, kv_indptr,
                                        kv_last_page_len)  # fmt: skip
            _check_types(op, named, (ckv_cache, ckv_sf_cache, kpe_cache))
            raise
        return
    named = _page_table_tensors(append_ckv, append_kpe, batch_indices, positions, kv_indices, kv_indptr,
                                kv_last_page_len)  # fmt: skip
    caches = (ckv_cache, ckv_sf_cache, kpe_cache)
    scales, scale_tensors = _scales_and_checks(op, named, caches, ckv_scale, kpe_scale)
    if debug_checks.ENABLED:
        geometry = _page_geometry(ckv_cache)
        if is_dynamo_compiling():  # checked by an op of its own at run time (the index data is device data)
            batch_indices = debug_checks.checked_batch_indices(
                batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, *scale_tensors, *geometry, True
            )
        else:
            debug_checks.check_index_data(
                batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, *scale_tensors, *geometry, True
            )
    append = _APPEND if is_dynamo_compiling() else _APPEND_OP
    append(append_ckv, append_kpe, batch_indices, positions, *caches, kv_indices, kv_indptr, kv_last_page_len,
           *scales, *scale_tensors)  # fmt: skip


def nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
    append_ckv: torch.Tensor,
    append_kpe: torch.Tensor,
    slot_mapping: torch.Tensor,
    ckv_cache: torch.Tensor,
    ckv_sf_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    ckv_scale: Scale,
    kpe_scale: Scale,
) -> None:
    """The same append addressed by flat slots: row i < slot_mapping.shape[0] goes to page slot // page_size, entry
    slot % page_size; negative slots (padding) and slots past the cache are skipped."""
    op = "append_paged_mla_kv_cache_with_slot_mapping"
    if type(ckv_scale) is float and type(kpe_scale) is float and not debug_checks.ENABLED and not is_dynamo_compiling():
        try:
            _APPEND_WITH_SLOT_MAPPING_OP(append_ckv, append_kpe, slot_mapping, ckv_cache, ckv_sf_cache, kpe_cache,
                                         ckv_scale, kpe_scale)  # fmt: skip
        except (TypeError, RuntimeError):
            _check_types(op, _slot_tensors(append_ckv, append_kpe, slot_mapping), (ckv_cache, ckv_sf_cache, kpe_cache))
            raise
        return
    named = _slot_tensors(append_ckv, append_kpe, slot_mapping)
    caches = (ckv_cache, ckv_sf_cache, kpe_cache)
    scales, scale_tensors = _scales_and_checks(op, named, caches, ckv_scale, kpe_scale)
    if debug_checks.ENABLED:
        geometry = _page_geometry(ckv_cache)
        if is_dynamo_compiling():
            slot_mapping = debug_checks.checked_slot_mapping(slot_mapping, *scale_tensors, *geometry, True)
        else:
            debug_checks.check_slot_data(slot_mapping, *scale_tensors, *geometry, True)
    append = _APPEND_WITH_SLOT_MAPPING if is_dynamo_compiling() else _APPEND_WITH_SLOT_MAPPING_OP
    append(append_ckv, append_kpe, slot_mapping, *caches, *scales, *scale_tensors)
