"""Negative log-likelihood and KL to the reference distribution, summed over predicted tokens."""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass
class TokenMetrics:
    nll: float = 0.0
    kl: float = 0.0
    tokens: int = 0

    def add(self, logits: torch.Tensor, reference_log_probs: torch.Tensor, targets: torch.Tensor) -> None:
        """logits, reference_log_probs: [T, vocab] of positions predicting targets [T]."""
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        self.nll -= float(log_probs.gather(-1, targets[:, None]).sum())
        # KL(reference || this), exactly 0 when the logits are the reference's.
        self.kl += float((reference_log_probs.exp() * (reference_log_probs - log_probs)).sum())
        self.tokens += targets.numel()

    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens)

    def mean_kl(self) -> float:
        return self.kl / self.tokens
