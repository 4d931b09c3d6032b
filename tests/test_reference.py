"""Tests of the pure-PyTorch reference (the oracle) against SPEC.md, independent of the compiled op.

Expected values here come from hand arithmetic, from brute-force nearest-value searches in float64, or from the
SPEC formulas written out per row in plain Python; never from the code under test.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_source import codes_of, load_reference, scale_bytes

ref = load_reference("nvfp4kv_reference_under_test")

INF = math.inf
NAN = math.nan
F32 = torch.float32


def f32(value: float) -> float:
    """value rounded to float32, back as a Python float."""
    return torch.tensor(value, dtype=F32).item()


def next_up(value: float) -> float:
    return torch.nextafter(torch.tensor(value, dtype=F32), torch.tensor(INF, dtype=F32)).item()


def next_down(value: float) -> float:
    return torch.nextafter(torch.tensor(value, dtype=F32), torch.tensor(-INF, dtype=F32)).item()


# ---------------------------------------------------------------------------------------------------------------
# E4M3 (block scale)
# ---------------------------------------------------------------------------------------------------------------


def e4m3_value_by_formula(code: int) -> float:
    """float8_e4m3fn decoding from its definition: s.eeee.mmm, bias 7, no infinities, NaN = s.1111.111."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return NAN
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


# The non-negative finite values, ascending, indexed by their code 0x00..0x7E.
E4M3_VALUES = torch.tensor([e4m3_value_by_formula(code) for code in range(0x7F)], dtype=torch.float64)
E4M3_MIDPOINTS = (E4M3_VALUES[:-1] + E4M3_VALUES[1:]) / 2  # midpoints[c] lies between codes c and c + 1


def nearest_e4m3_code_brute_force(values: torch.Tensor) -> torch.Tensor:
    """Nearest finite E4M3 code of finite values in [0, 448], ties to the even code, by searching all codes."""
    distance = (values.double()[:, None] - E4M3_VALUES[None, :]).abs()
    is_nearest = distance == distance.min(dim=1, keepdim=True).values
    is_tie = is_nearest.sum(dim=1, keepdim=True) == 2
    is_even = torch.arange(0x7F) % 2 == 0
    chosen = is_nearest & (is_even | ~is_tie)
    return chosen.int().argmax(dim=1).to(torch.uint8)


def test_e4m3_decoding_of_all_256_codes_matches_the_formula():
    decoded = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
    for code in range(256):
        expected = e4m3_value_by_formula(code)
        if math.isnan(expected):
            assert code in (0x7F, 0xFF), hex(code)
            assert math.isnan(decoded[code].item()), hex(code)
        else:
            assert decoded[code].item() == expected, hex(code)
            assert math.copysign(1.0, decoded[code].item()) == math.copysign(1.0, expected), hex(code)
    assert E4M3_VALUES[0x7E] == 448.0 and E4M3_VALUES[0x08] == 2.0**-6 and E4M3_VALUES[0x01] == 2.0**-9


def test_e4m3_every_representable_value_maps_to_its_own_code():
    codes = ref.round_to_e4m3_code(E4M3_VALUES.to(F32))
    assert codes.tolist() == list(range(0x7F))


def test_e4m3_every_midpoint_rounds_to_the_even_code():
    midpoints = E4M3_MIDPOINTS.to(F32)
    assert torch.equal(midpoints.double(), E4M3_MIDPOINTS)  # each midpoint is exact in fp32
    lower = torch.arange(0x7E)
    even_neighbour = torch.where(lower % 2 == 0, lower, lower + 1)
    assert ref.round_to_e4m3_code(midpoints).tolist() == even_neighbour.tolist()


def test_e4m3_values_just_around_midpoints_and_codes_round_to_the_nearest():
    midpoints = E4M3_MIDPOINTS.to(F32)
    lower = torch.arange(0x7E)
    below = torch.nextafter(midpoints, torch.zeros_like(midpoints))
    above = torch.nextafter(midpoints, torch.full_like(midpoints, INF))
    assert ref.round_to_e4m3_code(below).tolist() == lower.tolist()
    assert ref.round_to_e4m3_code(above).tolist() == (lower + 1).tolist()

    values = E4M3_VALUES.to(F32)
    for neighbour in (torch.nextafter(values, torch.zeros_like(values)), torch.nextafter(values, values + 1)):
        neighbour = neighbour[neighbour < 448]
        assert torch.equal(ref.round_to_e4m3_code(neighbour), nearest_e4m3_code_brute_force(neighbour))


@pytest.mark.parametrize(
    "t, code",
    [
        (0.0, 0x00),
        (1e-45, 0x00),  # smallest fp32 subnormal
        (2.0**-10, 0x00),  # half of the smallest E4M3 subnormal: tie, 0 is even
        (next_up(2.0**-10), 0x01),
        (1.5 * 2.0**-9, 0x02),  # tie between 0x01 and 0x02
        (7 * 2.0**-9, 0x07),  # largest subnormal
        (7.5 * 2.0**-9, 0x08),  # tie between the largest subnormal and the smallest normal
        (next_down(7.5 * 2.0**-9), 0x07),
        (2.0**-6, 0x08),  # smallest normal
        (1.0, 0x38),
        (432.0, 0x7E),  # tie between 416 (0x7D) and 448 (0x7E)
        (next_down(432.0), 0x7D),
    ],
)
def test_e4m3_named_boundaries(t, code):
    assert ref.round_to_e4m3_code(torch.tensor([t], dtype=F32)).item() == code


@pytest.mark.parametrize("t", [next_down(448.0), 448.0, next_up(448.0), 464.0, 479.0, 480.0, 1e6, 3.4e38, INF])
def test_e4m3_saturates_to_448_from_448_up_to_infinity(t):
    assert ref.round_to_e4m3_code(torch.tensor([t], dtype=F32)).item() == 0x7E


def test_e4m3_nan_input_saturates_deterministically():
    # Not fixed by the spec; t is NaN only when 6.0f * s overflows and the block holds an inf.
    assert ref.round_to_e4m3_code(torch.tensor([NAN], dtype=F32)).item() == 0x7E


def test_e4m3_random_values_match_brute_force():
    generator = torch.Generator().manual_seed(0)
    log2_values = torch.rand(20000, generator=generator, dtype=torch.float64) * 22 - 13  # 2**-13 .. 2**9
    values = (2.0**log2_values).to(F32)
    values = values[values < 448]
    assert torch.equal(ref.round_to_e4m3_code(values), nearest_e4m3_code_brute_force(values))


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.0, max_value=next_down(448.0), width=32))
def test_e4m3_any_float32_matches_brute_force(t):
    values = torch.tensor([t], dtype=F32)
    assert torch.equal(ref.round_to_e4m3_code(values), nearest_e4m3_code_brute_force(values))


def test_e4m3_scale_through_quantize_for_every_code_and_midpoint():
    # With s = 1: 6.0f * s = 6 and a block whose maximum is 6 * v gives t = v exactly (v has at most 5 significant
    # bits, so 6 * v is exact in fp32 and so is the division back).
    targets = torch.cat([E4M3_VALUES, E4M3_MIDPOINTS])
    blocks = torch.zeros(targets.numel(), 16, dtype=F32)
    blocks[:, 3] = (6 * targets).to(F32)
    lower = torch.arange(0x7E)
    expected = list(range(0x7F)) + torch.where(lower % 2 == 0, lower, lower + 1).tolist()
    _, scales = ref.quantize(blocks, 1.0)
    assert scale_bytes(scales) == expected


# ---------------------------------------------------------------------------------------------------------------
# E2M1 (element codes)
# ---------------------------------------------------------------------------------------------------------------

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

E2M1_CASES = [
    # (|y|, magnitude code); each threshold is a tie that goes to the even code
    (0.0, 0), (next_down(0.25), 0), (0.25, 0), (next_up(0.25), 1),
    (0.5, 1), (next_down(0.75), 1), (0.75, 2), (next_up(0.75), 2),
    (1.0, 2), (next_down(1.25), 2), (1.25, 2), (next_up(1.25), 3),
    (1.5, 3), (next_down(1.75), 3), (1.75, 4), (next_up(1.75), 4),
    (2.0, 4), (next_down(2.5), 4), (2.5, 4), (next_up(2.5), 5),
    (3.0, 5), (next_down(3.5), 5), (3.5, 6), (next_up(3.5), 6),
    (4.0, 6), (next_down(5.0), 6), (5.0, 6), (next_up(5.0), 7),
    (6.0, 7), (7.0, 7), (1e30, 7), (INF, 7), (NAN, 7),
]  # fmt: skip


@pytest.mark.parametrize("magnitude, code", E2M1_CASES)
def test_e2m1_thresholds_and_ties(magnitude, code):
    assert ref.round_to_e2m1_code(torch.tensor([magnitude], dtype=F32)).item() == code


def nearest_e2m1_code_brute_force(magnitude: float) -> int:
    distances = [abs(magnitude - value) for value in E2M1_VALUES]
    best = min(distances)
    candidates = [code for code, distance in enumerate(distances) if distance == best]
    return candidates[0] if len(candidates) == 1 else next(code for code in candidates if code % 2 == 0)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.0, max_value=8.0, width=32))
def test_e2m1_any_float32_matches_brute_force(magnitude):
    assert ref.round_to_e2m1_code(torch.tensor([magnitude], dtype=F32)).item() == nearest_e2m1_code_brute_force(
        magnitude
    )


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_e2m1_thresholds_through_quantize(sign):
    # Element 0 is 6.0, so a = 6, t = 6 / (6 * 1) = 1, sf = 1.0 (0x38), r = 1 / (1 * 1) = 1 and y = x exactly.
    finite = [(m, c) for m, c in E2M1_CASES if m <= 6.0]
    for start in range(0, len(finite), 15):
        chunk = finite[start : start + 15]
        block = [6.0] + [sign * m for m, _ in chunk] + [0.0] * (15 - len(chunk))
        packed, scales = ref.quantize(torch.tensor(block, dtype=F32), 1.0)
        sign_bit = 0x8 if sign < 0 else 0x0
        assert scale_bytes(scales) == [0x38], f"chunk from {start}"
        assert codes_of(packed)[: 1 + len(chunk)] == [7] + [sign_bit | c for _, c in chunk], f"chunk from {start}"


# ---------------------------------------------------------------------------------------------------------------
# Whole blocks
# ---------------------------------------------------------------------------------------------------------------


def test_hand_computed_block():
    x = torch.tensor([7, -7, 1, -0.25, 0.5, 1.5, -2, 3, 4, 5.5, 6, 0, -0.0, 0.125, -3, 2.75], dtype=torch.float16)
    # s = 0.5: 6.0f * s = 3.0; a = max|x| = 7; t = 7 / 3 = 2.333...
    # E4M3 in [2, 4) is spaced 0.25: neighbours 2.25 and 2.5; 2.333 - 2.25 = 0.083 < 0.167, so sf = 2.25
    # = 2**1 * (1 + 1/8): exponent field 1 + 7 = 8, mantissa 1 -> 0 1000 001 = 0x41.
    # r = 1 / (2.25 * 0.5) = 1 / 1.125 = 0.8889; y = x * r:
    #   x:    7    -7    1     -0.25  0.5   1.5   -2     3     4     5.5   6     0    -0    0.125  -3     2.75
    #   y:    6.22 -6.22 0.889 -0.222 0.444 1.333 -1.778 2.667 3.556 4.889 5.333 0    -0    0.111  -2.667 2.444
    #   code: 7    F     2     8      1     3     C      5     6     6     7     0    8     0      D      4
    # (|y| > 5 -> 7; (0.75, 1.25] -> 2; <= 0.25 -> 0 with the sign bit 8; (0.25, 0.75) -> 1; (1.25, 1.75) -> 3;
    #  (1.75, 2.5] -> 4; (2.5, 3.5) -> 5; (3.5, 5] -> 6.)
    # Bytes, even element in the low nibble: F7 82 31 5C 66 07 08 4D.
    packed, scales = ref.quantize(x, 0.5)
    assert packed.dtype == torch.uint8 and scales.dtype == torch.float8_e4m3fn
    assert packed.tolist() == [0xF7, 0x82, 0x31, 0x5C, 0x66, 0x07, 0x08, 0x4D]
    assert scale_bytes(scales) == [0x41]

    # Dequantized: e2m1 * 2.25 * 0.5 = e2m1 * 1.125, all exact.
    expected = [6.75, -6.75, 1.125, -0.0, 0.5625, 1.6875, -2.25, 3.375, 4.5, 4.5, 6.75, 0, -0.0, 0, -3.375, 2.25]
    values = ref.dequantize(packed, scales, 0.5)
    assert values.dtype == F32
    assert values.tolist() == expected
    assert torch.signbit(values).tolist() == [math.copysign(1, v) < 0 for v in expected]


def test_negative_zero_and_small_negatives_keep_the_sign_bit():
    # a = 6 -> r = 1; -0.0 and -0.1 (|y| <= 0.25) both get code 0x8, +0.0 gets 0x0.
    x = torch.tensor([-0.0, 0.0, -0.1, 6.0] + [0.0] * 12, dtype=torch.bfloat16)
    packed, _ = ref.quantize(x, 1.0)
    assert codes_of(packed)[:4] == [0x8, 0x0, 0x8, 0x7]


def test_all_zero_blocks():
    # a = 0 -> t = 0 -> sf = 0x00, r = 0; every code is 0 apart from the sign of -0.0.
    packed, scales = ref.quantize(torch.zeros(2, 32, dtype=torch.float16), 1.0)
    assert packed.flatten().tolist() == [0] * 32 and scale_bytes(scales) == [0] * 4
    packed, scales = ref.quantize(torch.full((16,), -0.0, dtype=torch.float16), 1.0)
    assert packed.tolist() == [0x88] * 8 and scale_bytes(scales) == [0]


def test_a_nan_poisons_only_its_own_block():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(48, generator=generator).to(torch.bfloat16)
    x[20] = NAN
    x[25] = INF  # the NaN rule comes first
    packed, scales = ref.quantize(x, 0.25)
    assert scale_bytes(scales)[1] == 0x7F
    assert packed[8:16].tolist() == [0] * 8
    for block in (0, 2):  # neighbours are quantized as if alone
        alone_packed, alone_scales = ref.quantize(x[16 * block : 16 * block + 16], 0.25)
        assert packed[8 * block : 8 * block + 8].tolist() == alone_packed.tolist(), f"block {block}"
        assert scale_bytes(scales)[block] == scale_bytes(alone_scales)[0], f"block {block}"
    assert torch.isnan(ref.dequantize(packed, scales, 0.25)[16:32]).all()


def test_infinities():
    # a = inf -> t = inf -> sf = 448 (0x7E); r = 1/448; y(+-inf) = +-inf -> code 7 / F; y(1) = 1/448 -> 0.
    x = torch.tensor([INF, -INF, 1.0] + [0.0] * 13, dtype=torch.float16)
    packed, scales = ref.quantize(x, 1.0)
    assert scale_bytes(scales) == [0x7E]
    assert codes_of(packed)[:3] == [0x7, 0xF, 0x0]
    assert ref.dequantize(packed, scales, 1.0)[:2].tolist() == [6 * 448.0, -6 * 448.0]


def test_tiny_global_scale_makes_r_infinite():
    # s = 2**-149 (smallest fp32 subnormal): 6.0f * s = 6 * 2**-149 exactly; t = 1 / that overflows to inf -> 448;
    # float(sf) * s = 448 * 2**-149 exactly; r = 1 / that = 2**149 / 448 > fp32 max -> inf.
    # y = x * inf: +-inf for x != 0 (code 7), NaN for x = +-0: the magnitude is 7, the sign that of x.
    x = torch.tensor([0.0, -0.0, 1.0, -0.5] + [0.0] * 12, dtype=F32)
    packed, scales = ref.quantize(x, 2.0**-149)
    assert scale_bytes(scales) == [0x7E]
    assert codes_of(packed)[:5] == [0x7, 0xF, 0x7, 0xF, 0x7]


def test_huge_global_scale_makes_six_s_infinite():
    # s = 1e38: 6.0f * s overflows to inf, t = a / inf = 0 -> sf = 0 -> r = 0: only sign bits remain.
    packed, scales = ref.quantize(torch.tensor([1.0, -2.0] + [0.0] * 14, dtype=F32), 1e38)
    assert scale_bytes(scales) == [0] and codes_of(packed)[:3] == [0x0, 0x8, 0x0]
    # With an inf in the block t = inf / inf = NaN, which saturates (the reference's choice); r = 1 / inf = 0,
    # y(inf) = inf * 0 = NaN -> magnitude 7.
    packed, scales = ref.quantize(torch.tensor([INF, -2.0] + [0.0] * 14, dtype=F32), 1e38)
    assert scale_bytes(scales) == [0x7E] and codes_of(packed)[:3] == [0x7, 0x8, 0x0]


def test_fp32_order_of_operations():
    # s = 1.3 is 1.29999995 in fp32 and 6.0f * s = 7.7999997 in fp32. Each case below gives different bytes if the
    # products are not rounded to fp32 in the order SPEC section 2 gives.
    s = f32(1.3)
    six_s = f32(6 * s)
    assert six_s == 7.799999713897705

    # Step 3, the division: a = 3.046875; a / six_s rounds to exactly 0.390625, the midpoint of 0.375 (0x2C) and
    # 0.40625 (0x2D), so the even 0x2C wins. Exact arithmetic, a / (6 * s) = 0.3906250143, would round up to 0x2D.
    a = 3.046875
    assert f32(a / six_s) == 0.390625 and a / (6 * s) > 0.390625
    _, scales = ref.quantize(torch.tensor([a] + [0.0] * 15, dtype=torch.float16), 1.3)
    assert scale_bytes(scales) == [0x2C]

    # Step 3, the product: with s = 0.7, 6.0f * s = 4.1999998 (fp32; the exact product is 4.19999993) and
    # a = 1.640625 gives t = 0.39062503 -> 0x2D. With the unrounded product t would be the tie 0.390625 -> 0x2C.
    s_07 = f32(0.7)
    assert f32(1.640625 / f32(6 * s_07)) == 0.3906250298023224 and f32(1.640625 / (6 * s_07)) == 0.390625
    _, scales = ref.quantize(torch.tensor([1.640625] + [0.0] * 15, dtype=torch.float16), 0.7)
    assert scale_bytes(scales) == [0x2D]

    # Step 5: a = 6.3359375 gives t = 0.8123 -> sf = 0.8125 (0x35). r = 1 / f32(0.8125 * s) = 0.94674557, and
    # x = 1.3203125 gives y = f32(x * r) = 1.25 exactly: a tie, code 2. (1 / sf) / s = 0.94674563 would give
    # y = 1.2500001 -> code 3.
    r = f32(1 / f32(0.8125 * s))
    assert f32(1.3203125 * r) == 1.25 and f32(1.3203125 * f32(f32(1 / 0.8125) / s)) > 1.25
    packed, scales = ref.quantize(torch.tensor([6.3359375, 1.3203125] + [0.0] * 14, dtype=torch.float16), 1.3)
    assert scale_bytes(scales) == [0x35] and codes_of(packed)[:2] == [0x7, 0x2]

    # Dequantization: (1.5 * sf) * s with sf = 0x0F = 15 * 2**-9; 1.5 * sf = 0.0439453125 is exact, so only the
    # product with s rounds. 1.5 * f32(sf * s) would round twice and end one ulp higher.
    sf = torch.tensor([0x0F], dtype=torch.uint8).view(torch.float8_e4m3fn)
    value = ref.dequantize(torch.tensor([0x03] + [0] * 7, dtype=torch.uint8), sf, 1.3)[0].item()
    assert value == f32(0.0439453125 * s) and value != f32(1.5 * f32(15 * 2.0**-9 * s))


def test_input_dtypes_agree_on_values_they_share():
    generator = torch.Generator().manual_seed(2)
    x = torch.randint(-64, 65, (3, 2, 64), generator=generator).to(F32) / 8  # exact in fp16, bf16 and fp32
    packed, scales = ref.quantize(x, 0.75)
    assert packed.shape == (3, 2, 32) and scales.shape == (3, 2, 4)
    for dtype in (torch.float16, torch.bfloat16):
        other_packed, other_scales = ref.quantize(x.to(dtype), 0.75)
        assert torch.equal(other_packed, packed) and scale_bytes(other_scales) == scale_bytes(scales)
    strided_packed, _ = ref.quantize(x.transpose(0, 1), 0.75)  # only the last dim has to be contiguous
    assert torch.equal(strided_packed, packed.transpose(0, 1))


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of 16"):
        ref.quantize(torch.zeros(24, dtype=torch.float16), 1.0)
    with pytest.raises(TypeError, match="dtype"):
        ref.quantize(torch.zeros(16, dtype=torch.int32), 1.0)


@pytest.mark.parametrize("dtype", [F32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("global_scale", [1.0, 0.37, 1 / 448, 5e-4, 3.0])
def test_round_trip_error_is_at_most_half_a_code_step(dtype, global_scale):
    generator = torch.Generator().manual_seed(3)
    # Row magnitudes 2**-16 .. 2**8 times s put t = a / (6 s) between 0 and ~200: block scales range from 0 through
    # subnormal E4M3 to large values, without saturation (which the bound does not cover).
    row_magnitude = 2.0 ** torch.randint(-16, 9, (512, 1), generator=generator).to(F32) * global_scale
    x = (torch.randn(512, 64, generator=generator) * row_magnitude).to(dtype)
    packed, scales = ref.quantize(x, global_scale)
    error = (ref.dequantize(packed, scales, global_scale).double() - x.double()).abs()

    s = f32(global_scale)
    block_scale = scales.to(torch.float64).repeat_interleave(16, dim=-1) * s
    y = (x.double() / block_scale).abs()
    code_step = torch.where(y <= 2, 0.5, torch.where(y <= 4, 1.0, 2.0))
    # A normal E4M3 scale is within 1/16 of t, so |y| <= 6 * (1 + 1/16) and values past 6.0 stay within half of its
    # step (2.0). Subnormal scales are coarser: |y| can go further past 6.0 and the error is then |y| - 6 code units.
    is_normal = block_scale >= 2.0**-6 * s
    assert (y[is_normal] <= 6.375 * (1 + 1e-6)).all()
    bound = torch.maximum(0.5 * code_step, y - 6) * block_scale
    # A zero block scale means t <= 2**-10 (half the smallest subnormal), so |x| <= 6 * s * 2**-10.
    bound = torch.where(block_scale == 0, 6 * s * 2.0**-10, bound)
    slack = 1e-6 * x.double().abs() + 1e-30  # fp32 rounding of r, y and the dequantization products
    assert (scales.to(F32) == 0).any() and (scales.to(F32) < 2.0**-6).any() and (scales.to(F32) > 64).any()
    assert (error <= bound + slack).all()


def test_dequantize_of_nan_scale_is_nan():
    packed = torch.zeros(8, dtype=torch.uint8)
    scales = torch.tensor([0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert torch.isnan(ref.dequantize(packed, scales, 1.0)).all()


# ---------------------------------------------------------------------------------------------------------------
# Paged append
# ---------------------------------------------------------------------------------------------------------------

POISON = 0xA5
PAGE_SIZE, HEADS, HEAD_DIM, MAX_NUM_PAGES = 4, 2, 32, 10
K_SCALE, V_SCALE = 0.5, 0.125


def target_slot(b, p, kv_indices, kv_indptr, batch_size):
    """(page, entry) of a row per SPEC section 1, or None when the row must be skipped."""
    if not 0 <= b < batch_size or p < 0:
        return None
    page_iter = kv_indptr[b] + p // PAGE_SIZE
    if not kv_indptr[b] <= page_iter < kv_indptr[b + 1] or not 0 <= page_iter < len(kv_indices):
        return None
    page = kv_indices[page_iter]
    if not 0 <= page < MAX_NUM_PAGES:
        return None
    return page, p % PAGE_SIZE


def make_scenario(seed, dtype):
    """Rows of five requests plus rows that every skip rule rejects, shuffled, with their index tensors."""
    generator = torch.Generator().manual_seed(seed)
    # Requests 0-2 are healthy: (tokens already cached, tokens appended) = (3, 2), (0, 5), (6, 3) need 2, 2, 3 pages.
    # Request 3's page index is past the cache, request 4's is negative, request 5's kv_indptr points past kv_indices.
    # The last page is never used, so a negative page index that wrapped around would show up there.
    healthy_pages = torch.randperm(MAX_NUM_PAGES - 1, generator=generator)[:7].tolist()
    kv_indices = healthy_pages + [MAX_NUM_PAGES, -1]
    kv_indptr = [0, 2, 4, 7, 8, 9, 10]
    kv_last_page_len = [1, 1, 1, 2, 2, 2]
    rows = [(0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 6), (2, 7), (2, 8)]
    # (1, 8) would land on request 2's pages; (-7, 1) would wrap around to request 0's unused slot 1.
    skipped = [(3, 0), (4, 1), (5, 0), (6, 0), (-1, 0), (-7, 1), (0, -1), (1, 8)]
    rows = rows + skipped
    order = torch.randperm(len(rows), generator=generator).tolist()
    rows = [rows[i] for i in order]
    kv = (torch.randn(len(rows), 2, HEADS, HEAD_DIM, generator=generator) * 3).to(dtype)
    return {
        "append_key": kv[:, 0],  # strided views of one [nnz, 2, H, D] tensor
        "append_value": kv[:, 1],
        "batch_indices": [b for b, _ in rows],
        "positions": [p for _, p in rows],
        "kv_indices": kv_indices,
        "kv_indptr": kv_indptr,
        "kv_last_page_len": kv_last_page_len,
        "num_skipped": len(skipped),
    }


def cache_shape(layout, last_dim):
    if layout == "NHD":
        return (MAX_NUM_PAGES, PAGE_SIZE, HEADS, last_dim)
    return (MAX_NUM_PAGES, HEADS, PAGE_SIZE, last_dim)


def make_poisoned_caches(form, layout):
    """(packed storage, scale storage as uint8): two 4-D tensors per kind for 'tuple', one 5-D tensor otherwise."""
    storages = []
    for last_dim in (HEAD_DIM // 2, HEAD_DIM // 16):
        shape = cache_shape(layout, last_dim)
        if form == "tuple":
            storages.append([torch.full(shape, POISON, dtype=torch.uint8) for _ in range(2)])
        else:
            storages.append(torch.full((shape[0], 2) + shape[1:], POISON, dtype=torch.uint8))
    return storages


def op_argument(storage, form, as_scales):
    """The cache argument of the op: tuple, stacked 5-D tensor, or tuple of the halves of a stacked tensor."""
    view = (lambda t: t.view(torch.float8_e4m3fn)) if as_scales else (lambda t: t)
    if form == "tuple":
        return tuple(view(t) for t in storage)
    if form == "stacked":
        return view(storage)
    return (view(storage)[:, 0], view(storage)[:, 1])


def slot_bytes(storage, kv, layout, page, entry, head):
    """The [last_dim] bytes of one (page, entry, head) slot of K (kv = 0) or V (kv = 1), written out per layout."""
    position = (page, entry, head) if layout == "NHD" else (page, head, entry)
    if isinstance(storage, list):
        return storage[kv][position]
    return storage[(position[0], kv) + position[1:]]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("form", ["tuple", "stacked", "tuple_of_views"])
@pytest.mark.parametrize("index_dtype, dtype", [(torch.int32, torch.float16), (torch.int64, torch.bfloat16)])
def test_append_writes_exactly_the_target_bytes(layout, form, index_dtype, dtype):
    scenario = make_scenario(seed=4, dtype=dtype)
    packed_storage, scale_storage = make_poisoned_caches(form, layout)
    expected_packed, expected_scales = make_poisoned_caches(form, layout)

    index = {name: torch.tensor(scenario[name], dtype=index_dtype) for name in
             ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len")}  # fmt: skip
    ref.nvfp4_quantize_append_paged_kv_cache(
        scenario["append_key"],
        scenario["append_value"],
        index["batch_indices"],
        index["positions"],
        op_argument(packed_storage, form, as_scales=False),
        op_argument(scale_storage, form, as_scales=True),
        index["kv_indices"],
        index["kv_indptr"],
        index["kv_last_page_len"],
        K_SCALE,
        V_SCALE,
        kv_layout=layout,
    )

    batch_size = len(scenario["kv_last_page_len"])
    num_skipped = 0
    for row, (b, p) in enumerate(zip(scenario["batch_indices"], scenario["positions"])):
        slot = target_slot(b, p, scenario["kv_indices"], scenario["kv_indptr"], batch_size)
        if slot is None:
            num_skipped += 1
            continue
        for kv, (append, scale) in enumerate([(scenario["append_key"], K_SCALE), (scenario["append_value"], V_SCALE)]):
            for head in range(HEADS):
                packed, scales = ref.quantize(append[row, head], scale)
                slot_bytes(expected_packed, kv, layout, *slot, head).copy_(packed)
                slot_bytes(expected_scales, kv, layout, *slot, head).copy_(scales.view(torch.uint8))
    assert num_skipped == scenario["num_skipped"]  # every skip rule is exercised

    def flat(storage):
        return torch.cat([t.flatten() for t in storage]) if isinstance(storage, list) else storage.flatten()

    assert torch.equal(flat(packed_storage), flat(expected_packed))
    assert torch.equal(flat(scale_storage), flat(expected_scales))
    assert (flat(packed_storage) != POISON).sum() > 0


def test_append_to_the_same_slot_twice_keeps_the_last_row():
    # Not fixed by the spec; the reference is deterministic and the later row wins.
    k_cache = torch.full(cache_shape("NHD", HEAD_DIM // 2), POISON, dtype=torch.uint8)
    v_cache = k_cache.clone()
    k_sf = torch.full(cache_shape("NHD", HEAD_DIM // 16), POISON, dtype=torch.uint8).view(torch.float8_e4m3fn)
    v_sf = k_sf.clone()
    key = torch.randn(3, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(5)).to(torch.float16)
    ref.nvfp4_quantize_append_paged_kv_cache(
        key, key, torch.tensor([0, 0, 0]), torch.tensor([1, 1, 2]), (k_cache, v_cache), (k_sf, v_sf),
        torch.tensor([3]), torch.tensor([0, 1]), torch.tensor([3]), 1.0, 1.0,
    )  # fmt: skip
    packed, _ = ref.quantize(key[1], 1.0)
    assert torch.equal(k_cache[3, 1], packed)


def test_append_with_no_rows_and_a_bad_layout():
    k_cache = torch.full(cache_shape("NHD", HEAD_DIM // 2), POISON, dtype=torch.uint8)
    k_sf = torch.full(cache_shape("NHD", HEAD_DIM // 16), POISON, dtype=torch.uint8).view(torch.float8_e4m3fn)
    empty = torch.zeros(0, HEADS, HEAD_DIM, dtype=torch.float16)
    no_rows = torch.zeros(0, dtype=torch.int32)
    arguments = (empty, empty, no_rows, no_rows, (k_cache, k_cache), (k_sf, k_sf), no_rows,
                 torch.zeros(1, dtype=torch.int32), no_rows, 1.0, 1.0)  # fmt: skip
    ref.nvfp4_quantize_append_paged_kv_cache(*arguments)
    assert (k_cache == POISON).all()
    with pytest.raises(ValueError, match="kv_layout"):
        ref.nvfp4_quantize_append_paged_kv_cache(*arguments, kv_layout="NDH")
