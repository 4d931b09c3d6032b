"""Hand-computed bytes for the corners of SPEC section 2, through the real op.

Each test quantizes one 16-value block (one row, one head, one page) and compares the scale byte and
the 16 E2M1 codes with values worked out by hand in the comments. E2M1 codes: magnitude index into
{0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign. E4M3 bytes: 0x38 = 1.0, 0x39 = 1.125, 0x3A = 1.25,
0x7E = 448 (max), 0x07 = 7 * 2^-9 (largest subnormal), 0x08 = 2^-6 (smallest normal), 0x7F = NaN.
"""

import math

import pytest
import torch

import nvfp4kv


def quantize_blocks(values, scale=1.0, dtype=torch.bfloat16, device="cpu"):
    """Runs the op on one row of len(values) (a multiple of 16); returns (scale bytes, codes)."""
    head_dim = len(values)
    row = torch.tensor(values, dtype=torch.float32).to(dtype).reshape(1, 1, head_dim).to(device)
    cache = torch.full((1, 2, 1, 1, head_dim // 2), 0xA5, dtype=torch.uint8, device=device)
    cache_sf = torch.full((1, 2, 1, 1, head_dim // 16), 0x5A, dtype=torch.uint8, device=device)
    index = torch.zeros(1, dtype=torch.int32, device=device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        row,
        row,
        index,
        index,
        cache,
        cache_sf.view(torch.float8_e4m3fn),
        index,
        torch.tensor([0, 1], dtype=torch.int32, device=device),
        torch.ones(1, dtype=torch.int32, device=device),
        scale,
        scale,
        "NHD",
    )
    assert torch.equal(cache[:, 0], cache[:, 1]) and torch.equal(cache_sf[:, 0], cache_sf[:, 1])
    packed = cache[0, 0, 0, 0].cpu()
    codes = torch.stack([packed & 0xF, packed >> 4], dim=1).flatten().tolist()
    return cache_sf[0, 0, 0, 0].cpu().tolist(), codes


def neg(code):
    return code | 8


def test_all_zero_block(device):
    # a = 0 -> t = 0 -> sf = 0x00, r = 0, every y = +0 -> code 0.
    assert quantize_blocks([0.0] * 16, device=device) == ([0x00], [0] * 16)


def test_negative_zero_keeps_its_sign(device):
    # a = 0 -> r = 0; y = -0.0 * 0 = -0.0 -> sign bit set, magnitude 0: code 0x8.
    values = [-0.0, 0.0] * 8
    assert quantize_blocks(values, device=device) == ([0x00], [8, 0] * 8)


def test_e2m1_ties_round_half_to_even(device):
    # a = 6, s = 1: t = 6 / 6 = 1 -> sf = 0x38 (1.0), r = 1 / (1 * 1) = 1, so y = x.
    # Ties: 0.25 -> 0 (0.0), 0.75 -> 2 (1.0), 1.25 -> 2 (1.0), 1.75 -> 4 (2.0), 2.5 -> 4 (2.0),
    #       3.5 -> 6 (4.0), 5.0 -> 6 (4.0); 6 -> 7. Negatives mirror with bit 3.
    values = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0]
    expected = [7, 0, 2, 2, 4, 4, 6, 6]
    assert quantize_blocks(values, device=device) == ([0x38], expected + [neg(c) for c in expected])


def test_e2m1_neighbours_of_ties(device):
    # fp16 steps are 2^-12 in [0.25, 0.5), 2^-11 in [0.5, 1), 2^-10 in [1, 2), ...: one step above a tie
    # rounds up, one step below rounds down.
    # sf = 0x38 and r = 1 as above (a = 6).
    e = 2.0**-10
    values = [
        6.0,
        0.25 + e / 4,
        0.75 - e / 2,
        1.25 + e,
        1.75 - e,
        2.5 + 2 * e,
        3.5 - 2 * e,
        5.0 + 4 * e,
        0.5,
        1.0,
        1.5,
        2.0,
        3.0,
        4.0,
        0.1,
        5.9,
    ]
    expected = [7, 1, 1, 3, 3, 5, 5, 7, 1, 2, 3, 4, 5, 6, 0, 7]
    assert quantize_blocks(values, dtype=torch.float16, device=device) == ([0x38], expected)


@pytest.mark.parametrize(
    "amax,scale_byte",
    [
        (6.375, 0x38),  # t = 1.0625, halfway between 1.0 (0x38, even) and 1.125 (0x39): -> 0x38
        (7.125, 0x3A),  # t = 1.1875, halfway between 1.125 (0x39) and 1.25 (0x3A, even): -> 0x3A
        (0.087890625, 0x08),  # t = 7.5 * 2^-9, halfway between 0x07 and 0x08 (even): -> 0x08
        (0.0859375, 0x07),  # t = 44/6 * 2^-9 = 7.33 * 2^-9: nearest is 0x07
        (0.01171875, 0x01),  # t = 2^-9 exactly: the smallest subnormal
        (0.005859375, 0x00),  # t = 0.5 * 2^-9: halfway between 0 and 0x01 -> 0 (even)
    ],
)
def test_e4m3_scale_ties_and_subnormal_boundary(amax, scale_byte, device):
    scales, codes = quantize_blocks([amax] + [0.0] * 15, device=device)
    assert scales == [scale_byte]
    # The 15 zeros stay code 0 whatever the scale.
    assert codes[1:] == [0] * 15


def test_scale_saturates_at_448(device):
    # a = 3000 >= 448 * 6: t = 500 -> sf saturates to 0x7E (448); r = 1/448: 3000/448 = 6.7 -> 7 (6.0),
    # 1000/448 = 2.23 -> 4 (2.0), 100/448 = 0.223 -> 0.
    values = [3000.0, -1000.0, 100.0] + [0.0] * 13
    assert quantize_blocks(values, device=device) == ([0x7E], [7, neg(4), 0] + [0] * 13)


def test_infinity(device):
    # a = inf: t = inf -> 0x7E; r = 1/448; inf * r = inf -> 7; -inf -> 0xF; 448 * r = 1 -> 2.
    values = [math.inf, -math.inf, 448.0, 1.0] + [0.0] * 12
    assert quantize_blocks(values, device=device) == ([0x7E], [7, 15, 2, 0] + [0] * 12)


def test_tiny_block_scale_underflows_to_zero(device):
    # a = 2^-10, s = 1: t = 2^-10 / 6 < 2^-10 (half the smallest E4M3 subnormal 2^-9) -> sf = 0,
    # so r = 0 and every code is a signed zero.
    values = [2.0**-10, -(2.0**-11)] + [0.0] * 14
    assert quantize_blocks(values, device=device) == ([0x00], [0, 8] + [0] * 14)


def test_nan_block_and_its_clean_neighbour(device):
    # Block 0 holds a NaN: scale 0x7F, codes 0. Block 1 is an ordinary block (a = 6 -> 0x38).
    values = [1.0, math.nan] + [2.0] * 14 + [6.0, 3.0] + [0.0] * 14
    scales, codes = quantize_blocks(values, device=device)
    assert scales == [0x7F, 0x38]
    assert codes == [0] * 16 + [7, 5] + [0] * 14
    packed = torch.tensor([codes[2 * k] | codes[2 * k + 1] << 4 for k in range(16)], dtype=torch.uint8)
    decoded = nvfp4kv.dequantize(
        packed.to(device), torch.tensor(scales, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device), 1.0
    ).cpu()
    assert decoded[:16].isnan().all()
    assert decoded[16:18].tolist() == [6.0, 3.0]


def test_fp16_extremes(device):
    # fp16 max 65504, s = 1: t = 10917 -> 0x7E; r = 1/448: 65504/448 = 146 -> 7. The smallest fp16
    # subnormal 2^-24 -> 0; -65504 -> 0xF.
    values = [65504.0, -65504.0, 2.0**-24, -(2.0**-24)] + [0.0] * 12
    assert quantize_blocks(values, dtype=torch.float16, device=device) == ([0x7E], [7, 15, 0, 8] + [0] * 12)


def test_bf16_extremes(device):
    # bf16 max (about 3.39e38) with s = 1e30: 6 s = 6e30, t = 5.6e7 -> 0x7E; r = 1 / (448 * 1e30):
    # y = 3.39e38 / 4.48e32 = 7.6e5 -> 7. The smallest bf16 normal 2^-126 -> y ~ 0 -> 0.
    bf16_max = float(torch.finfo(torch.bfloat16).max)
    values = [bf16_max, -bf16_max, 2.0**-126] + [0.0] * 13
    assert quantize_blocks(values, scale=1e30, device=device) == ([0x7E], [7, 15, 0] + [0] * 13)


def test_global_scale_is_applied_before_rounding(device):
    # s = 0.5: 6 s = 3, a = 3 -> t = 1 -> 0x38; r = 1 / (1 * 0.5) = 2, so y = 2x:
    # 3 -> 6 (7), 1 -> 2 (4), 0.4 -> 0.8 (2), 0.1 -> 0.2 (0).
    values = [3.0, 1.0, 0.4, 0.1] + [0.0] * 12
    assert quantize_blocks(values, scale=0.5, device=device) == ([0x38], [7, 4, 2, 0] + [0] * 12)
