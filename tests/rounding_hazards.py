"""Blocks on which rounding the exact product x * r differs from SPEC's rounding of RN(x * r).

SPEC step 6 rounds y = RN(x r) to the E2M1 grid. Rounding the exact product instead (what a multiply
contracted into the rounding's addition, an FMA, computes) gives another code when RN(x r) lands
exactly on a rounding boundary t that x r itself misses. With m the 24-bit significand of r and n that
of x, that happens when n m is within half an ulp of tau 2^J (tau = 4..7, the significands of the
boundaries 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5). It is common for calibrated global scales (amax /
(6 * 448) has a short significand, so its reciprocals are ratios of small integers) and rare for
arbitrary ones (~3e-5 of all r for bf16 inputs, ~2e-4 for fp16). This module builds such r from
(tau, n), a global scale s whose reciprocal for a chosen scale byte is that r, and 16-value blocks
whose chosen scale byte is that byte and which hold such an x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

from nvfp4kv import reference

BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_code(magnitude: torch.Tensor) -> torch.Tensor:
    """SPEC step 6's magnitude code of |y| for any real (float64 included): nearest, ties to even."""
    m = magnitude.abs()
    reached = (m > 0.25, m >= 0.75, m > 1.25, m >= 1.75, m > 2.5, m >= 3.5, m > 5.0)
    return sum(r.to(torch.int64) for r in reached)


def f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def reciprocal(scale_byte: int, s: float) -> float:
    """SPEC step 5: RN(1 / RN(sf * s))."""
    sf = torch.tensor([scale_byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float()[0]
    return float(f32(1.0) / (sf * f32(s)))


@dataclass
class Hazard:
    s: float  # global scale
    scale_byte: int  # the E4M3 byte whose reciprocal is r
    r: float
    inputs: List[float]  # x with e2m1_code(RN(x r)) != e2m1_code(x r)


def find_hazard(input_bits: int, tau: int, n: int, scale_byte: int) -> Optional[Hazard]:
    """r with significand m = round(tau 2^J / n), J = input_bits + 21 (so |n m - tau 2^J| <= n / 2 is
    within half an ulp of tau 2^J), a global scale giving that r for scale_byte, and the inputs n 2^k
    (at every boundary of significand tau / 4) whose codes differ; None when there is none."""
    j = input_bits + 21
    m = round(tau * 2**j / n)
    if n * m == tau * 2**j or not 2**23 <= m < 2**24:
        return None
    r = m / 2**23  # in [1, 2)
    sf = reciprocal(scale_byte, 1.0)  # 1 / float(sf)
    s0 = f32(sf / r)
    candidates, below, above = [float(s0)], s0, s0
    for _ in range(8):  # the float32 s nearest to 1 / (sf r) and its neighbours
        below, above = torch.nextafter(below, f32(0.0)), torch.nextafter(above, f32(math.inf))
        candidates += [float(below), float(above)]
    s = next((c for c in candidates if reciprocal(scale_byte, c) == r), None)
    if s is None:
        return None
    inputs = []
    for t in BOUNDARIES:
        significand = t / 2.0 ** math.floor(math.log2(t))  # t = significand 2^e, significand in [1, 2)
        if significand != tau / 4:
            continue
        x = n * 2.0 ** round(math.log2(t * 2**23 / (tau * 2**j)))  # x r = t (1 + (n m - tau 2^J) / (tau 2^J))
        y = float(f32(x) * f32(r))
        exact = torch.tensor(x, dtype=torch.float64) * torch.tensor(r, dtype=torch.float64)
        if y == t and int(e2m1_code(torch.tensor(y))) != int(e2m1_code(exact)):
            inputs.append(x)
    return Hazard(s, scale_byte, r, inputs) if inputs else None


def hazard_blocks(hazard: Hazard, dtype: torch.dtype, seed: int, scale_search: str) -> torch.Tensor:
    """[N, 16] blocks of `dtype` whose scale byte (reference.quantize with scale_search) is
    hazard.scale_byte and which hold one of hazard.inputs: for the 6- and the 4-targeted candidate, an
    absmax a with that byte, the input, and other values on that candidate's grid (so that it tends to
    win the 4-over-6 choice)."""
    g = torch.Generator().manual_seed(seed)
    step = 1.0 / hazard.r  # float(sf) * s, one E2M1 unit
    blocks = []
    for target in (6.0, 4.0):
        for x in hazard.inputs:
            if x >= target * step:
                continue
            for _ in range(4):
                grid = torch.tensor(E2M1_VALUES)[torch.randint(0, 8 if target == 6.0 else 7, (16,), generator=g)]
                signs = torch.where(torch.rand(16, generator=g) < 0.5, -1.0, 1.0)
                block = (grid * step * signs).to(dtype)
                block[0] = torch.tensor(target * step).to(dtype)
                block[int(torch.randint(1, 16, (1,), generator=g))] = torch.tensor(x).to(dtype)
                _, scales = reference.quantize(block.float()[None], hazard.s, scale_search=scale_search)
                if int(scales.view(torch.uint8)[0, 0]) == hazard.scale_byte:
                    blocks.append(block)
    return torch.stack(blocks) if blocks else torch.empty(0, 16, dtype=dtype)
