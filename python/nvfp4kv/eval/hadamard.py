"""The orthonormal Hadamard matrix (Sylvester's construction) that rotates K and Q along head_dim."""

from __future__ import annotations

import torch


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """[n, n] with H @ H.T == I; n a power of two. q @ H and k @ H keep every q . k."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard_matrix: n must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n**0.5).to(dtype=dtype, device=device)
