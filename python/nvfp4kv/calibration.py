"""Choosing the global decode scale of a K or V tensor from its absolute maximum."""

from __future__ import annotations

import math
import numbers
from typing import Union

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
SMALLEST_SCALE = 2.0**-126  # the smallest normal float32
FLOAT32_MAX = 3.4028234663852886e38


def global_scale_from_amax(amax: Union[float, torch.Tensor]) -> Union[float, torch.Tensor]:
    """The decode scale amax / (6 * 448).

    A block's scale is E4M3(block_amax / (6 * s)). With s = amax / (6 * 448), the block holding the
    tensor's largest value gets the largest E4M3 scale, 448, and no block saturates; smaller blocks get
    proportionally smaller scales, staying out of E4M3's subnormal range (below 2^-6, where the scale
    itself loses precision) unless they are about 2^15 times smaller than amax. With s = 1.0 instead,
    activations of ordinary size (|x| of a few units) give block scales around 0.1-1, and small blocks
    land among E4M3's few subnormal steps, so their values are coarsely scaled.
    Works on floats and on tensors (per-layer amax tensors give per-layer scales, on their device).

    The result is always a usable scale (positive, finite in float32), never one with which every
    later append would be skipped:
    - a Python number (float or int): ValueError when amax is NaN, +-inf or negative; amax == 0
      (all-zero calibration data) gives 1.0, the uncalibrated default; otherwise amax / (6 * 448)
      clamped to [2**-126, float32 max], so that it neither underflows to 0 nor overflows float32.
    - a tensor: elementwise in float32 without synchronising (GPU-friendly, capturable): positive
      finite entries give max(amax / (6 * 448), 2**-126); entries that are 0, negative, NaN or +-inf
      (in float32) give 1.0.
    - a bool (or a bool tensor): TypeError.
    """
    name = "nvfp4kv.global_scale_from_amax"
    if isinstance(amax, torch.Tensor):
        if amax.dtype == torch.bool or amax.is_complex():
            raise TypeError(f"{name}: amax must be a float, an int or a real tensor, got a {amax.dtype} tensor")
        a = amax.to(torch.float32)
        usable = (a > 0) & (a <= FLOAT32_MAX)  # NaN fails both
        return torch.where(usable, torch.clamp(a / (E2M1_MAX * E4M3_MAX), min=SMALLEST_SCALE), 1.0)
    if isinstance(amax, bool) or not isinstance(amax, numbers.Real):
        raise TypeError(f"{name}: amax must be a float, an int or a real tensor, got {type(amax).__name__}")
    if not (amax >= 0 and math.isfinite(amax)):  # NaN fails amax >= 0
        raise ValueError(f"{name}: amax must be a finite, non-negative number, got {amax}")
    if amax == 0:
        return 1.0
    return min(max(amax / (E2M1_MAX * E4M3_MAX), SMALLEST_SCALE), FLOAT32_MAX)
