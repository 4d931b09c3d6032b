"""The FlashInfer-compatible paged-KV API (flashinfer.page.nvfp4_quantize_append_paged_kv_cache)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

Cache = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def _split_cache(cache: Cache, name: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(K, V) for a tuple cache; (stacked, None) for one 5-D tensor, which the op takes whole."""
    if isinstance(cache, torch.Tensor):
        return cache, None
    if isinstance(cache, (tuple, list)) and len(cache) == 2:
        return cache[0], cache[1]
    raise TypeError(f"nvfp4kv.append_paged_kv_cache: {name} must be a tensor or a (K, V) tuple of two "
                    f"tensors, got {type(cache).__name__}" +
                    (f" of length {len(cache)}" if isinstance(cache, (tuple, list)) else ""))


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
    k_scale: float,
    v_scale: float,
    kv_layout: str = "NHD",
) -> None:
    """Quantize and append K/V rows into an NVFP4 paged KV cache (in place).

    append_key / append_value: [nnz, num_kv_heads, head_dim], float16 or bfloat16.
    paged_kv_cache: (k_cache, v_cache) uint8 [max_num_pages, page_size, num_kv_heads, head_dim // 2]
        (NHD) or [max_num_pages, num_kv_heads, page_size, head_dim // 2] (HND), or one 5-D tensor with
        K/V on dim 1. kv_cache_sf: the same with float8_e4m3fn and head_dim // 16.
    k_scale / v_scale: global decode scales (value = e2m1 * block_scale * global_scale).
    Row i of request batch_indices[i] at logical position positions[i] goes to page
    kv_indices[kv_indptr[b] + p // page_size], entry p % page_size. See SPEC.md for the bit recipe.
    """
    k_cache, v_cache = _split_cache(paged_kv_cache, "paged_kv_cache")
    k_cache_sf, v_cache_sf = _split_cache(kv_cache_sf, "kv_cache_sf")
    torch.ops.nvfp4kv.append_paged_kv_cache(
        append_key, append_value, batch_indices, positions, k_cache, v_cache, k_cache_sf, v_cache_sf,
        kv_indices, kv_indptr, kv_last_page_len, k_scale, v_scale, kv_layout)


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
