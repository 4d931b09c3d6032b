"""Dequantization of NVFP4 data (packed E2M1 + E4M3 block scales + a global scale)."""

from __future__ import annotations

import torch

from .page import _dtype_name


def dequantize(packed: torch.Tensor, scales: torch.Tensor, global_scale: float) -> torch.Tensor:
    """float32 [..., D] = e2m1(code) * float(block_scale) * global_scale.

    packed: uint8 [..., D/2] (low nibble = even element); scales: float8_e4m3fn [..., D/16].
    """
    return torch.ops.nvfp4kv.dequantize(packed, scales, global_scale)


def e2m1_and_ufp8sf_scale_to_float(
    e2m1_tensor: torch.Tensor,
    ufp8_scale_tensor: torch.Tensor,
    global_scale_tensor: torch.Tensor,
    sf_vec_size: int = 16,
    ufp8_type: int = 1,
    is_sf_swizzled_layout: bool = True,
) -> torch.Tensor:
    """FlashInfer-compatible dequantization for the LINEAR scale layout.

    e2m1_tensor: uint8 [M, K/2] with K/2 a multiple of 8; ufp8_scale_tensor: E4M3 scales (uint8 or
    float8_e4m3fn) on its device, [M, K/16] or flat; global_scale_tensor: one-element float32 decode scale
    (on any device). Returns float32 [M, K] on the input's device:
    e2m1 * block_scale * global_scale. Pass is_sf_swizzled_layout=False: nvfp4kv caches hold linear scales.
    """
    name = "nvfp4kv.fp4_quantization.e2m1_and_ufp8sf_scale_to_float"
    if is_sf_swizzled_layout:
        raise NotImplementedError(
            f"{name}: only the linear scale layout (is_sf_swizzled_layout=False) is "
            "supported; nvfp4kv caches store linear scales"
        )
    if sf_vec_size != 16:
        raise NotImplementedError(f"{name}: sf_vec_size must be 16 (NVFP4), got {sf_vec_size}")
    if ufp8_type != 1:
        raise NotImplementedError(f"{name}: ufp8_type must be 1 (E4M3 scales), got {ufp8_type}")
    expected = "a 2-D uint8 tensor [M, K/2] with K/2 a multiple of 8"
    if not isinstance(e2m1_tensor, torch.Tensor):
        raise TypeError(f"{name}: e2m1_tensor must be {expected}, got {type(e2m1_tensor).__name__}")
    if e2m1_tensor.dtype != torch.uint8 or e2m1_tensor.dim() != 2 or e2m1_tensor.shape[1] % 8 != 0:
        raise ValueError(
            f"{name}: e2m1_tensor must be {expected}, got dtype {_dtype_name(e2m1_tensor.dtype)}, "
            f"shape {list(e2m1_tensor.shape)}"
        )
    rows, half_k = e2m1_tensor.shape
    if not isinstance(ufp8_scale_tensor, torch.Tensor):
        raise TypeError(
            f"{name}: ufp8_scale_tensor must be a uint8 or float8_e4m3fn tensor, got {type(ufp8_scale_tensor).__name__}"
        )
    if ufp8_scale_tensor.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise ValueError(
            f"{name}: ufp8_scale_tensor must be a uint8 or float8_e4m3fn tensor, got dtype "
            f"{_dtype_name(ufp8_scale_tensor.dtype)}"
        )
    if ufp8_scale_tensor.numel() != rows * half_k // 8:
        raise ValueError(
            f"{name}: ufp8_scale_tensor must hold M * K/16 = {rows * half_k // 8} scales, got "
            f"{ufp8_scale_tensor.numel()}"
        )
    if ufp8_scale_tensor.device != e2m1_tensor.device:
        raise ValueError(
            f"{name}: ufp8_scale_tensor must be on e2m1_tensor's device ({e2m1_tensor.device}), got "
            f"{ufp8_scale_tensor.device}"
        )
    if not isinstance(global_scale_tensor, torch.Tensor):
        raise TypeError(
            f"{name}: global_scale_tensor must be a one-element float32 tensor, got "
            f"{type(global_scale_tensor).__name__}"
        )
    if global_scale_tensor.dtype != torch.float32 or global_scale_tensor.numel() != 1:
        raise ValueError(
            f"{name}: global_scale_tensor must be a one-element float32 tensor, got dtype "
            f"{_dtype_name(global_scale_tensor.dtype)}, shape {list(global_scale_tensor.shape)}"
        )
    scales = ufp8_scale_tensor.reshape(rows, half_k // 8)
    if scales.dtype == torch.uint8:
        scales = scales.view(torch.float8_e4m3fn)
    # 0-d, so that it multiplies without broadcasting; it may live on another device (e.g. the CPU).
    global_scale = global_scale_tensor.reshape(()).to(e2m1_tensor.device)
    # (e2m1 * sf) * 1.0 is exact; the multiply by the global scale then rounds like the op's recipe.
    return dequantize(e2m1_tensor, scales, 1.0) * global_scale
