"""The attention function the evaluation installs: quantizes each layer's post-RoPE K/V by a recipe,
then attends over them in float32.

Without a cache (a whole window of text in one forward), query i sees keys 0..i: exactly what decode
reads back from the cache, the current token included. Keys i - j < recipe.window stay in bf16.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Dict, Optional

import torch

from ..calibration import global_scale_from_amax
from .hadamard import hadamard_matrix
from .kv_round_trip import round_trip
from .recipes import Recipe

IMPLEMENTATION = "nvfp4kv_eval"


class QuantizedAttention:
    """Call it as a transformers attention function. `calibrating` records the per-layer and per-head
    amax of K, V and rotated K; `recipe` (None: bf16) chooses the quantization; `squares` sums the
    squared errors and values of what was quantized, for the relative RMS."""

    def __init__(self):
        self.recipe: Optional[Recipe] = None
        self.calibrating = False
        self.amax: Dict[tuple, torch.Tensor] = {}  # (layer, "k" | "v" | "k_rotated") -> [heads]
        self.squares = defaultdict(float)  # "k_error", "k", "v_error", "v"

    def _record_amax(self, layer: int, name: str, x: torch.Tensor) -> None:
        amax = x.abs().amax(dim=(0, 2, 3)).float().cpu()
        previous = self.amax.get((layer, name))
        self.amax[(layer, name)] = amax if previous is None else torch.maximum(previous, amax)

    def _scales(self, layer: int, name: str):
        if self.recipe.global_scale == "one":
            return 1.0
        amax = self.amax[(layer, name)]
        if self.recipe.global_scale == "layer":
            return float(global_scale_from_amax(float(amax.max())))
        return [float(global_scale_from_amax(float(a))) for a in amax]

    def __call__(self, module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        layer = module.layer_idx
        recipe = self.recipe
        q, k, v = query.float(), key.to(torch.bfloat16), value.to(torch.bfloat16)  # [B, H, T, D]
        if recipe is not None and recipe.hadamard:
            rotation = hadamard_matrix(q.shape[-1], device=q.device)
            q, k = q @ rotation, (k.float() @ rotation).to(torch.bfloat16)
        if self.calibrating:
            self._record_amax(layer, "k", key.to(torch.bfloat16))
            self._record_amax(layer, "v", v)
            rotation = hadamard_matrix(k.shape[-1], device=k.device)
            self._record_amax(layer, "k_rotated", (key.float() @ rotation).to(torch.bfloat16))
        k_exact, v_exact = k.float(), v.float()
        k_used, v_used = k_exact, v_exact
        if recipe is not None and (recipe.quantize_k or recipe.quantize_v):
            batch, heads, tokens, head_dim = k.shape
            rows = (k.transpose(1, 2).reshape(-1, heads, head_dim), v.transpose(1, 2).reshape(-1, heads, head_dim))
            k_q, v_q = round_trip(
                *rows,
                self._scales(layer, "k_rotated" if recipe.hadamard else "k"),
                self._scales(layer, "v"),
                recipe.scale_search,
            )
            k_q = k_q.reshape(batch, tokens, heads, head_dim).transpose(1, 2)
            v_q = v_q.reshape(batch, tokens, heads, head_dim).transpose(1, 2)
            if recipe.quantize_k:
                k_used = k_q
                self.squares["k_error"] += float((k_q - k_exact).pow(2).sum())
                self.squares["k"] += float(k_exact.pow(2).sum())
            if recipe.quantize_v:
                v_used = v_q
                self.squares["v_error"] += float((v_q - v_exact).pow(2).sum())
                self.squares["v"] += float(v_exact.pow(2).sum())
        output = _attend(q, k_used, v_used, k_exact, v_exact, scaling, recipe.window if recipe else 0)
        return output.transpose(1, 2).contiguous().to(query.dtype), None


def _attend(q, k, v, k_exact, v_exact, scaling: float, window: int) -> torch.Tensor:
    """Causal attention in float32, grouped-query heads shared; keys within `window` of the query are exact."""
    groups = q.shape[1] // k.shape[1]
    k, v, k_exact, v_exact = (t.repeat_interleave(groups, dim=1) for t in (k, v, k_exact, v_exact))
    tokens = q.shape[2]
    distance = torch.arange(tokens, device=q.device)[:, None] - torch.arange(k.shape[2], device=q.device)[None, :]
    scores = (q @ k.transpose(-1, -2)) * scaling
    recent = (distance >= 0) & (distance < window)
    if window > 0:
        scores = torch.where(recent, (q @ k_exact.transpose(-1, -2)) * scaling, scores)
    probabilities = torch.softmax(scores.masked_fill(distance < 0, float("-inf")), dim=-1)
    if window == 0:
        return probabilities @ v
    return (probabilities * ~recent) @ v + (probabilities * recent) @ v_exact


@contextlib.contextmanager
def installed(model, attention: QuantizedAttention):
    """Runs the model's attention layers through `attention` inside the block."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)  # unused: _attend builds its causal mask
    previous = model.config._attn_implementation
    model.set_attn_implementation(IMPLEMENTATION)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
