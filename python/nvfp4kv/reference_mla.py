"""Pure-PyTorch reference of the MLA latent append (docs/SPEC.md section 4), the test oracle of the MLA ops.

Like nvfp4kv.reference (whose block quantizer, E4M3 rounding and row placement it uses) it is written for
exactness, depends on torch only and never loads the compiled library.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .reference import E4M3_NAN_CODE, quantize, resolve_targets, round_to_e4m3_code

__all__ = [
    "quantize_kpe",
    "nvfp4_quantize_append_paged_mla_kv_cache",
    "nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping",
]


def quantize_kpe(x: Tensor, kpe_scale: float) -> Tensor:
    """float8_e4m3fn bit patterns (uint8) of y = x / kpe_scale (one IEEE float32 division): nearest even,
    saturating to +-448 (+-inf too), the sign kept (-0.0 -> 0x80), NaN -> 0x7F."""
    y = x.float() / torch.tensor(kpe_scale, dtype=torch.float32)
    magnitude = round_to_e4m3_code(y.abs())
    sign = torch.signbit(y).to(torch.uint8) << 7
    return torch.where(torch.isnan(y), E4M3_NAN_CODE, sign | magnitude).to(torch.uint8)


def _write_rows(append_ckv, append_kpe, rows, page, entry, ckv_cache, ckv_sf_cache, kpe_cache, ckv_scale, kpe_scale):
    packed, scales = quantize(append_ckv[rows], ckv_scale)  # [n, C/2], [n, C/16]
    ckv_cache[page, entry] = packed
    ckv_sf_cache.view(torch.uint8)[page, entry] = scales.view(torch.uint8)  # index_put_ has no float8
    if kpe_cache.dtype == torch.float8_e4m3fn:
        kpe_cache.view(torch.uint8)[page, entry] = quantize_kpe(append_kpe[rows], kpe_scale)
    else:  # a cache of the inputs' 16-bit dtype keeps the kpe values as they are
        kpe_cache[page, entry] = append_kpe[rows]


def nvfp4_quantize_append_paged_mla_kv_cache(
    append_ckv: Tensor,
    append_kpe: Tensor,
    batch_indices: Tensor,
    positions: Tensor,
    ckv_cache: Tensor,
    ckv_sf_cache: Tensor,
    kpe_cache: Tensor,
    kv_indices: Tensor,
    kv_indptr: Tensor,
    kv_last_page_len: Tensor,
    ckv_scale: float,
    kpe_scale: float,
) -> None:
    """Append latent rows in place: ckv [nnz, C] to NVFP4 (ckv_cache uint8 [pages, page_size, C/2], ckv_sf_cache
    float8_e4m3fn [pages, page_size, C/16]), kpe [nnz, R] to float8_e4m3fn bytes (kpe_cache [pages, page_size, R])
    or as they are into a cache of their own dtype. Placement and skipped rows as in the paged K/V append."""
    rows, page, entry = resolve_targets(
        batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, ckv_cache.shape[0], ckv_cache.shape[1]
    )
    _write_rows(append_ckv, append_kpe, rows, page, entry, ckv_cache, ckv_sf_cache, kpe_cache, ckv_scale, kpe_scale)


def nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
    append_ckv: Tensor,
    append_kpe: Tensor,
    slot_mapping: Tensor,
    ckv_cache: Tensor,
    ckv_sf_cache: Tensor,
    kpe_cache: Tensor,
    ckv_scale: float,
    kpe_scale: float,
) -> None:
    """The slot-mapping variant: row i < slot_mapping.numel() goes to page slot // page_size, entry
    slot % page_size; negative slots and slots past the cache are skipped."""
    pages, page_size = ckv_cache.shape[:2]
    slots = slot_mapping.long()
    rows = torch.arange(slots.numel(), device=slots.device)
    keep = (slots >= 0) & (slots < pages * page_size)
    rows, slots = rows[keep], slots[keep]
    _write_rows(append_ckv, append_kpe, rows, slots // page_size, slots % page_size, ckv_cache, ckv_sf_cache,
                kpe_cache, ckv_scale, kpe_scale)  # fmt: skip
