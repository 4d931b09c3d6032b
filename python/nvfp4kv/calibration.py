"""Choosing the global decode scale of a K or V tensor from its absolute maximum."""

from __future__ import annotations

from typing import Union

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0


def global_scale_from_amax(amax: Union[float, torch.Tensor]) -> Union[float, torch.Tensor]:
    """The decode scale amax / (6 * 448).

    A block's scale is E4M3(block_amax / (6 * s)). With s = amax / (6 * 448), the block holding the
    tensor's largest value gets the largest E4M3 scale, 448, and no block saturates; smaller blocks get
    proportionally smaller scales, staying out of E4M3's subnormal range (below 2^-6, where the scale
    itself loses precision) unless they are about 2^15 times smaller than amax. With s = 1.0 instead,
    activations of ordinary size (|x| of a few units) give block scales around 0.1-1, and small blocks
    land among E4M3's few subnormal steps, so their values are coarsely scaled.
    Works on floats and on tensors (per-layer amax tensors give per-layer scales, on their device).
    """
    return amax / (E2M1_MAX * E4M3_MAX)
