"""The evaluation loop: per text, a calibration pass, then per window of text the reference forward
(bf16 K/V) and one forward per recipe, each compared with the reference."""

from __future__ import annotations

from typing import Dict, List

import torch

from .metrics import TokenMetrics
from .quantized_attention import QuantizedAttention, installed
from .recipes import Recipe


def windows(ids: torch.Tensor, context: int) -> List[torch.Tensor]:
    """Non-overlapping [1, <= context] pieces; each predicts all its tokens but the first."""
    return [ids[:, start : start + context] for start in range(0, ids.shape[1] - 1, context)]


@torch.inference_mode()
def evaluate_text(model, ids: torch.Tensor, recipes: List[Recipe], context: int, progress) -> List[Dict]:
    attention = QuantizedAttention()
    device = next(model.parameters()).device
    pieces = [w.to(device) for w in windows(ids, context) if w.shape[1] > 1]
    metrics = {r.name: TokenMetrics() for r in recipes}
    squares = {r.name: dict.fromkeys(("k_error", "k", "v_error", "v"), 0.0) for r in recipes}
    with installed(model, attention):
        attention.calibrating = True  # per-layer amax over the whole text, with bf16 K/V
        for piece in pieces:
            model(piece, use_cache=False, logits_to_keep=1)
            progress.update(1)
        attention.calibrating = False
        for piece in pieces:
            attention.recipe = None
            reference = torch.log_softmax(model(piece, use_cache=False).logits[0, :-1].float(), dim=-1)
            targets = piece[0, 1:]
            progress.update(1)
            for recipe in recipes:
                attention.recipe, attention.squares = recipe, squares[recipe.name]
                metrics[recipe.name].add(model(piece, use_cache=False).logits[0, :-1], reference, targets)
                progress.update(1)
            del reference
    return [_row(recipe, metrics[recipe.name], squares[recipe.name]) for recipe in recipes]


def _row(recipe: Recipe, metrics: TokenMetrics, squares: Dict[str, float]) -> Dict:
    def relative_rms(name: str) -> float:
        return (squares[f"{name}_error"] / squares[name]) ** 0.5 if squares[name] else 0.0

    return {
        "recipe": recipe.name,
        "perplexity": metrics.perplexity(),
        "mean_kl": metrics.mean_kl(),
        "rel_rms_k": relative_rms("k"),
        "rel_rms_v": relative_rms("v"),
        "tokens": metrics.tokens,
    }


def forwards_per_text(tokens: int, context: int, recipes: int) -> int:
    """The forwards evaluate_text runs (the progress bar's total)."""
    pieces = len([s for s in range(0, tokens - 1, context) if tokens - s > 1])
    return pieces * (2 + recipes)
