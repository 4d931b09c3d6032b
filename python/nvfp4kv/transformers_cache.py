"""A transformers cache whose layers keep K/V in an NVFP4 paged cache written by nvfp4kv's op.

    cache = NVFP4Cache(model.config)            # or k_scales=[...], v_scales=[...] per layer
    model.generate(input_ids, **{cache_keyword(model): cache}, max_new_tokens=32)

(transformers renamed generate's `past_key_values=` to `cache=` within release 5; cache_keyword says which.)

Each update appends the new post-RoPE rows (as bf16) into the layer's pages, then returns the whole
cache dequantized for the model's own attention (SDPA or eager). A layer's global scales, when not
given, are calibrated on its first update (the prefill): amax / (6 * 448); later rows beyond that amax
saturate their block scales. Request b's pages are b, b + B, b + 2B, ... so the pool grows by B pages.
Beam reordering and cropping are not supported.
"""

from __future__ import annotations

import inspect
from typing import Optional, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .calibration import global_scale_from_amax
from .page import dequantize_paged_kv_cache, get_batch_indices_positions, nvfp4_quantize_append_paged_kv_cache


class NVFP4PagedLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(
        self,
        k_scale: Optional[float] = None,
        v_scale: Optional[float] = None,
        page_size: int = 16,
        scale_search: str = "none",
    ):
        super().__init__()
        self.k_scale, self.v_scale = k_scale, v_scale
        self.page_size, self.scale_search = page_size, scale_search
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, head_dim = key_states.shape
        self.device, self.dtype, self.batch = key_states.device, key_states.dtype, batch
        self.cache = torch.zeros(0, 2, self.page_size, heads, head_dim // 2, dtype=torch.uint8, device=self.device)
        self.cache_sf = torch.zeros(
            0, 2, self.page_size, heads, head_dim // 16, dtype=torch.float8_e4m3fn, device=self.device
        )
        if self.k_scale is None:
            self.k_scale = global_scale_from_amax(float(key_states.to(torch.bfloat16).abs().max()))
        if self.v_scale is None:
            self.v_scale = global_scale_from_amax(float(value_states.to(torch.bfloat16).abs().max()))
        self.is_initialized = True

    def _page_table(self, length: int):
        pages = -(-length // self.page_size)
        request = torch.arange(self.batch, dtype=torch.int32, device=self.device)
        kv_indices = (
            request[:, None] + self.batch * torch.arange(pages, dtype=torch.int32, device=self.device)
        ).flatten()
        kv_indptr = torch.arange(self.batch + 1, dtype=torch.int32, device=self.device) * pages
        last = torch.full((self.batch,), length - (pages - 1) * self.page_size, dtype=torch.int32, device=self.device)
        return kv_indices, kv_indptr, last, pages

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states, value_states: [batch, kv_heads, new_tokens, head_dim] -> the whole cache, dequantized."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        batch, heads, new, head_dim = key_states.shape
        kv_indices, kv_indptr, kv_last_page_len, pages = self._page_table(self.length + new)
        missing = pages * batch - self.cache.shape[0]
        if missing > 0:
            self.cache = torch.cat([self.cache, self.cache.new_zeros(missing, *self.cache.shape[1:])])
            self.cache_sf = torch.cat([self.cache_sf, self.cache_sf.new_zeros(missing, *self.cache_sf.shape[1:])])
        append_indptr = torch.arange(batch + 1, dtype=torch.int32, device=self.device) * new
        seq_lens = torch.full((batch,), self.length + new, dtype=torch.int32, device=self.device)
        batch_indices, positions = get_batch_indices_positions(append_indptr, seq_lens, batch * new)

        def rows(x: torch.Tensor) -> torch.Tensor:  # [batch * new, heads, head_dim], request-major
            return x.transpose(1, 2).reshape(batch * new, heads, head_dim).to(torch.bfloat16).contiguous()

        nvfp4_quantize_append_paged_kv_cache(
            rows(key_states),
            rows(value_states),
            batch_indices,
            positions,
            self.cache,
            self.cache_sf,
            kv_indices,
            kv_indptr,
            kv_last_page_len,
            self.k_scale,
            self.v_scale,
            "NHD",
            scale_search=self.scale_search,
        )
        self.length += new
        keys, values = dequantize_paged_kv_cache(
            self.cache, self.cache_sf, kv_indices, kv_indptr, kv_last_page_len, self.k_scale, self.v_scale,
            out_dtype=self.dtype,
        )  # fmt: skip

        def unrows(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, self.length, heads, head_dim).transpose(1, 2)

        return unrows(keys), unrows(values)

    def get_mask_sizes(self, query_length: int) -> tuple:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length, self.is_initialized = 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("NVFP4PagedLayer does not reorder its pages for beam search")


class NVFP4Cache(Cache):
    """One NVFP4PagedLayer per decoder layer; k_scales / v_scales: one float per layer, or None to calibrate."""

    def __init__(
        self,
        config,
        k_scales: Optional[Sequence[float]] = None,
        v_scales: Optional[Sequence[float]] = None,
        page_size: int = 16,
        scale_search: str = "none",
    ):
        layers = config.get_text_config(decoder=True).num_hidden_layers
        k_scales = k_scales if k_scales is not None else [None] * layers
        v_scales = v_scales if v_scales is not None else [None] * layers
        super().__init__(layers=[NVFP4PagedLayer(k, v, page_size, scale_search) for k, v in zip(k_scales, v_scales)])


def cache_keyword(model) -> str:
    """The keyword that hands a cache to `model.generate` / `model(...)`: "cache" where the model's forward
    takes it (newer transformers 5 releases), else "past_key_values"."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
