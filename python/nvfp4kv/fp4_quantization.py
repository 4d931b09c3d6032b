"""Dequantization of NVFP4 data (packed E2M1 + E4M3 block scales + a global scale)."""

from __future__ import annotations

import torch


def dequantize(packed: torch.Tensor, scales: torch.Tensor, global_scale: float) -> torch.Tensor:
    """float32 [..., D] = e2m1(code) * float(block_scale) * global_scale.

    packed: uint8 [..., D/2] (low nibble = even element); scales: float8_e4m3fn [..., D/16].
    """
    return torch.ops.nvfp4kv.dequantize(packed, scales, global_scale)
