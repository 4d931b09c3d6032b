"""K/V rows through the op and back: append into a paged NVFP4 cache, then dequantize it."""

from __future__ import annotations

from typing import Sequence, Union

import torch

import nvfp4kv

PAGE_SIZE = 16


def round_trip(
    key: torch.Tensor,
    value: torch.Tensor,
    k_scales: Union[float, Sequence[float]],
    v_scales: Union[float, Sequence[float]],
    scale_search: str = "none",
):
    """key, value: [rows, heads, head_dim] bf16 -> their dequantized float32 copies.

    A float scale serves every head; a sequence gives one per head, one op call each (the op takes one
    global scale per call)."""
    if isinstance(k_scales, float) and isinstance(v_scales, float):
        return _round_trip_one_scale(key, value, k_scales, v_scales, scale_search)
    heads = key.shape[1]
    k_scales = [k_scales] * heads if isinstance(k_scales, float) else k_scales
    v_scales = [v_scales] * heads if isinstance(v_scales, float) else v_scales
    parts = [
        _round_trip_one_scale(key[:, h : h + 1], value[:, h : h + 1], k_scales[h], v_scales[h], scale_search)
        for h in range(heads)
    ]
    return torch.cat([k for k, _ in parts], 1), torch.cat([v for _, v in parts], 1)


def _round_trip_one_scale(key, value, k_scale: float, v_scale: float, scale_search: str):
    rows, heads, head_dim = key.shape
    pages = -(-rows // PAGE_SIZE)
    device = key.device
    cache = torch.zeros(pages, 2, PAGE_SIZE, heads, head_dim // 2, dtype=torch.uint8, device=device)
    cache_sf = torch.zeros(pages, 2, PAGE_SIZE, heads, head_dim // 16, dtype=torch.float8_e4m3fn, device=device)
    kv_indices = torch.arange(pages, dtype=torch.int32, device=device)
    kv_indptr = torch.tensor([0, pages], dtype=torch.int32, device=device)
    kv_last_page_len = torch.tensor([rows - (pages - 1) * PAGE_SIZE], dtype=torch.int32, device=device)
    append_indptr = torch.tensor([0, rows], dtype=torch.int32, device=device)
    seq_lens = nvfp4kv.get_seq_lens(kv_indptr, kv_last_page_len, PAGE_SIZE)
    batch_indices, positions = nvfp4kv.get_batch_indices_positions(append_indptr, seq_lens, rows)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        key.contiguous(),
        value.contiguous(),
        batch_indices,
        positions,
        cache,
        cache_sf,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        k_scale,
        v_scale,
        "NHD",
        scale_search=scale_search,
    )
    return nvfp4kv.dequantize_paged_kv_cache(
        cache, cache_sf, kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale, out_dtype=torch.float32
    )
