"""Tests of the pure-PyTorch RoPE reference (python/nvfp4kv/reference_rope.py) against SPEC.md section 5,
independent of the compiled op.

The reference's modules are loaded from their files as submodules of a stand-in package, so the package's
__init__ (which loads the compiled library) never runs. Expected values come from hand arithmetic: small
dyadic numbers whose products and sums are exact, and 16-bit patterns written out; never from the code under test.
"""

import importlib
import math
import sys
import types
from pathlib import Path

import pytest
import torch

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
INF, NAN = math.inf, math.nan


def load_reference_rope(package_name: str = "nvfp4kv_rope_reference_under_test"):
    """python/nvfp4kv/reference_rope.py and the references it imports, as modules of a package that has no
    __init__ code."""
    if package_name not in sys.modules:
        package = types.ModuleType(package_name)
        package.__path__ = [str(Path(__file__).resolve().parents[1] / "python" / "nvfp4kv")]
        sys.modules[package_name] = package
    return importlib.import_module(f"{package_name}.reference_rope")


ref = load_reference_rope()


def test_the_compiled_library_is_not_loaded():
    assert "nvfp4kv_rope_reference_under_test.library" not in sys.modules
    assert ref.__name__ == "nvfp4kv_rope_reference_under_test.reference_rope"


def bits(t: torch.Tensor) -> list:
    """16-bit patterns of a float16/bfloat16 tensor as non-negative ints."""
    return [b & 0xFFFF for b in t.view(torch.int16).flatten().tolist()]


def row_of_bits(patterns, dtype) -> torch.Tensor:
    """A [1, 1, D] tensor of the given 16-bit patterns."""
    signed = [p - 0x10000 if p >= 0x8000 else p for p in patterns]
    return torch.tensor(signed, dtype=torch.int16).view(dtype).view(1, 1, -1)


def table(rows, dtype=F32) -> torch.Tensor:
    return torch.tensor(rows, dtype=F32).to(dtype)


def positions(*values, dtype=torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------------
# The rotation
# ---------------------------------------------------------------------------------------------------------------

X16 = [float(v) for v in range(1, 17)]  # X[d] = d + 1
COS = [j / 8 for j in range(8)]  # c_j = j/8
SIN = [1 - j / 16 for j in range(8)]  # s_j = 1 - j/16


def test_neox_pairs_dim_j_with_dim_j_plus_half():
    """D = R = 16, m = 8: (a, b) = (j, j + 8). Every product and sum is exact in float32 and float16."""
    x = torch.tensor(X16, dtype=F16).view(1, 1, 16)
    out, valid = ref.apply_rope(x, table([COS + SIN]), positions(0), is_neox=True)
    expected = [0.0] * 16
    for j in range(8):
        xa, xb = X16[j], X16[j + 8]
        expected[j] = xa * COS[j] - xb * SIN[j]
        expected[j + 8] = xb * COS[j] + xa * SIN[j]
    # j = 0: 1 * 0 - 9 * 1 = -9 and 9 * 0 + 1 * 1 = 1; j = 7: 8 * 7/8 - 16 * 9/16 = -2 and 16 * 7/8 + 8 * 9/16 = 18.5
    assert expected[0] == -9.0 and expected[8] == 1.0 and expected[7] == -2.0 and expected[15] == 18.5
    assert out.dtype == F16 and out.flatten().tolist() == expected
    assert valid.tolist() == [True]


def test_gptj_pairs_even_with_odd_dims():
    """D = R = 16, m = 8: (a, b) = (2j, 2j + 1)."""
    x = torch.tensor(X16, dtype=BF16).view(1, 1, 16)
    out, _ = ref.apply_rope(x, table([COS + SIN]), positions(0), is_neox=False)
    expected = [0.0] * 16
    for j in range(8):
        xa, xb = X16[2 * j], X16[2 * j + 1]
        expected[2 * j] = xa * COS[j] - xb * SIN[j]
        expected[2 * j + 1] = xb * COS[j] + xa * SIN[j]
    # j = 0: 1 * 0 - 2 * 1 = -2 and 2 * 0 + 1 * 1 = 1; j = 1: 3/8 - 4 * 15/16 = -3.375 and 4/8 + 3 * 15/16 = 3.3125
    assert expected[:4] == [-2.0, 1.0, -3.375, 3.3125]
    # Exact in float32, then rounded to bfloat16 (8 significant bits): j = 7: 16 * 7/8 + 15 * 9/16 = 22.4375
    # = 10110.0111b is a tie between 22.375 and 22.5; the even one, 22.5, wins.
    assert expected[15] == 22.4375
    expected = torch.tensor(expected, dtype=F32).to(BF16).tolist()
    assert expected[15] == 22.5
    assert out.dtype == BF16 and out.flatten().tolist() == expected


def test_quarter_turn_moves_each_pair_by_hand():
    """cos = 0, sin = 1: NeoX O[j] = -X[j + 8], O[j + 8] = X[j]; GPT-J O[2j] = -X[2j + 1], O[2j + 1] = X[2j]."""
    x = torch.tensor(X16, dtype=F16).view(1, 1, 16)
    quarter = table([[0.0] * 8 + [1.0] * 8])
    neox, _ = ref.apply_rope(x, quarter, positions(0), is_neox=True)
    gptj, _ = ref.apply_rope(x, quarter, positions(0), is_neox=False)
    assert neox.flatten().tolist() == [-9, -10, -11, -12, -13, -14, -15, -16, 1, 2, 3, 4, 5, 6, 7, 8]
    assert gptj.flatten().tolist() == [-2, 1, -4, 3, -6, 5, -8, 7, -10, 9, -12, 11, -14, 13, -16, 15]


def test_each_row_uses_the_table_row_of_its_position_and_every_head():
    """Rows at positions 2, 0, 1 of a 3-row table with 2 heads; R = 2 (one pair) rotates dims 0 and 1 only."""
    x = torch.tensor(X16 * 2, dtype=F16).view(1, 2, 16).repeat(3, 1, 1)
    cos_sin = table([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # 0, 90 and 180 degrees
    out, valid = ref.apply_rope(x, cos_sin, positions(2, 0, 1, dtype=torch.int32), is_neox=True)
    assert valid.tolist() == [True, True, True]
    for head in range(2):
        assert out[0, head].tolist() == [-1.0, -2.0] + X16[2:]  # 180 degrees
        assert out[1, head].tolist() == X16  # 0 degrees (1 * 1 - 2 * 0 = 1, 2 * 1 + 1 * 0 = 2)
        assert out[2, head].tolist() == [-2.0, 1.0] + X16[2:]  # 90 degrees


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("is_neox", [True, False])
def test_partial_rotary_copies_the_tail_bit_for_bit(dtype, is_neox):
    """R = 8 < D = 16: dims 8..15 keep their 16-bit patterns, signalling and negative NaNs with payloads included
    (any trip through float32 would set the quiet bit or could lose the payload)."""
    if dtype == F16:
        tail = [0x7C01, 0xFE37, 0x8000, 0x7C00, 0x0001, 0x3C00, 0x7D55, 0xFC00]  # sNaN, -qNaN payload, -0, inf, ...
        one = 0x3C00
    else:
        tail = [0x7F81, 0xFFC5, 0x8000, 0x7F80, 0x0001, 0x3F80, 0x7FA5, 0xFF80]
        one = 0x3F80
    head = [one] * 8  # every rotated value is 1.0
    x = row_of_bits(head + tail, dtype)
    out, _ = ref.apply_rope(x, table([[0.5] * 4 + [0.25] * 4]), positions(0), is_neox=is_neox)
    assert bits(out)[8:] == tail
    # Rotated: 1 * 0.5 - 1 * 0.25 = 0.25 at each a, 1 * 0.5 + 1 * 0.25 = 0.75 at each b.
    a_dims = [0, 1, 2, 3] if is_neox else [0, 2, 4, 6]
    rotated = out.flatten()[:8].tolist()
    assert [rotated[d] for d in a_dims] == [0.25] * 4
    assert [rotated[d] for d in range(8) if d not in a_dims] == [0.75] * 4


def test_float16_overflow_gives_inf_and_nan_stays_nan():
    """60000 and -60000 with c = s = 1: a = 60000 - (-60000) = 120000 > 65504 -> +inf (0x7C00),
    b = -60000 + 60000 = +0; inf * 0 is NaN, written as the quiet NaN 0x7E00; bfloat16 holds 120000 (as 119808)."""
    x = torch.tensor([60000.0, INF, 0, 0, -60000.0, 1.0, 0, 0] + [0.0] * 8, dtype=F16).view(1, 1, 16)
    out, _ = ref.apply_rope(x, table([[1.0, 0.0, 1, 1, 1.0, 0.0, 1, 1]]), positions(0), is_neox=True)
    got = bits(out)
    assert got[0] == 0x7C00  # 60000 * 1 - (-60000) * 1
    assert got[4] == 0x0000  # -60000 * 1 + 60000 * 1 = +0
    assert got[1] == 0x7E00  # inf * 0 - 1 * 0 = NaN
    assert got[5] == 0x7E00  # 1 * 0 + inf * 0 = NaN
    xb = torch.tensor([60000.0, 0, 0, 0, -60000.0, 0, 0, 0] + [0.0] * 8, dtype=BF16).view(1, 1, 16)
    outb, _ = ref.apply_rope(xb, table([[1.0, 1, 1, 1, 1, 1, 1, 1]]), positions(0), is_neox=True)
    # bf16(60000) = 59904 (0x476A); 59904 * 2 = 119808 is exact in bfloat16 (0x47EA).
    assert bits(outb)[0] == 0x47EA and outb.flatten()[0].item() == 119808.0


def test_nan_of_either_sign_is_written_as_the_canonical_quiet_nan():
    x = torch.tensor([NAN, -NAN] + [0.0] * 14, dtype=BF16).view(1, 1, 16)
    out, _ = ref.apply_rope(x, table([[1.0, 1.0]]), positions(0), is_neox=True)
    assert bits(out)[:2] == [0x7FC0, 0x7FC0]


def fp16_bits_of_multiple_of_2_24(units: int, negative: bool = False) -> int:
    """float16 pattern of units * 2**-24 (units < 1024: subnormal, the pattern is the unit count)."""
    return (0x8000 if negative else 0) | units


def test_products_and_sums_are_rounded_separately_not_fused():
    """x = y = 3 (float16), c = 1 + 2**-23, s = 1 (float32), NeoX dims (0, 8).

    x * c = 3 + 3 * 2**-23 exactly; float32 has spacing 2**-22 at 3, so it is a tie between 3 + 2**-22 (odd) and
    3 + 2**-21 (even): rounded, 3 + 2**-21. Then (x * c) - (y * s) = 2**-21 = 8 * 2**-24, float16 pattern 0x0008.
    A fused fma(x, c, -(y * s)) would give 3 * 2**-23 = 6 * 2**-24 (0x0006).
    The second row swaps the roles (c = 1, s = 1 + 2**-23): 3 - (3 + 2**-21) = -2**-21 (0x8008), where
    fma(-y, s, x * c) would give -6 * 2**-24 (0x8006).
    """
    c = 1 + 2.0**-23
    x = torch.tensor([3.0] + [0.0] * 7 + [3.0] + [0.0] * 7, dtype=F16).view(1, 1, 16).repeat(2, 1, 1)
    cos_sin = table([[c] + [1.0] * 7 + [1.0] * 8, [1.0] * 8 + [c] + [1.0] * 7])
    assert cos_sin[0, 0].item() == c  # representable in float32
    out, _ = ref.apply_rope(x, cos_sin, positions(0, 1), is_neox=True)
    got = bits(out)
    separate, fused = 8, 6
    assert (3 * c - 3) / 2.0**-24 == fused  # the exact (fused) value, for contrast
    assert got[0] == fp16_bits_of_multiple_of_2_24(separate)
    assert got[16] == fp16_bits_of_multiple_of_2_24(separate, negative=True)
    # The b dims: (3 + 2**-21) + 3 = 6 + 2**-21 in float32 (exact), which rounds to 6.0 in float16.
    assert out[0, 0, 8].item() == 6.0 and out[1, 0, 8].item() == 6.0


def test_sum_of_rounded_products_in_bfloat16():
    """The same construction for the b dim in bfloat16: y * c + x * s with y = 3, c = 1 + 2**-23, x = -3, s = 1:
    round(3 * c) = 3 + 2**-21, minus 3 = 2**-21 (bfloat16 0x3500); fused it would be 0.75 * 2**-21 (0x34C0)."""
    c = 1 + 2.0**-23
    x = torch.tensor([-3.0] + [0.0] * 7 + [3.0] + [0.0] * 7, dtype=BF16).view(1, 1, 16)
    out, _ = ref.apply_rope(x, table([[c] + [1.0] * 7 + [1.0] * 8]), positions(0), is_neox=True)
    assert bits(out)[8] == 0x3500 and out[0, 0, 8].item() == 2.0**-21
    assert torch.tensor(0.75 * 2.0**-21, dtype=BF16).view(torch.int16).item() == 0x34C0


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_positions_outside_the_table_give_zero_rows(index_dtype):
    """max_pos = 2: positions -1, -7 and 2 (== max_pos) are invalid: the whole row is +0, tail included."""
    x = torch.tensor(X16, dtype=F16).view(1, 1, 16).repeat(5, 2, 1)
    cos_sin = table([[1.0] * 4 + [0.0] * 4, [0.0] * 4 + [1.0] * 4])  # R = 8
    out, valid = ref.apply_rope(x, cos_sin, positions(-1, 0, 2, 1, -7, dtype=index_dtype), is_neox=True)
    assert valid.tolist() == [False, True, False, True, False]
    for row in (0, 2, 4):
        assert bits(out[row]) == [0] * 32
    assert out[1, 1].tolist() == X16


@pytest.mark.parametrize("table_dtype", [F16, BF16])
def test_half_precision_tables_are_widened_exactly(table_dtype):
    """X = (1, 0) in the first pair gives O = (c, s) exactly: the table's 16-bit values, widened without change.
    float16(0.1) = 0x2E66 = 0.0999755859375, bfloat16(0.1) = 0x3DCD = 0.10009765625; float16 2**-20 is subnormal."""
    c16 = torch.tensor(0.1, dtype=table_dtype)
    s16 = torch.tensor(2.0**-20, dtype=table_dtype)
    expected_c = 0.0999755859375 if table_dtype == F16 else 0.10009765625
    assert c16.item() == expected_c and s16.item() == 2.0**-20
    x = torch.tensor([1.0] + [0.0] * 15, dtype=table_dtype).view(1, 1, 16)
    cos_sin = torch.stack([c16, s16]).view(1, 2)
    out, _ = ref.apply_rope(x, cos_sin, positions(0), is_neox=True)
    assert out[0, 0, 0].item() == expected_c and out[0, 0, 1].item() == 2.0**-20
    widened = ref.apply_rope(x, cos_sin.float(), positions(0), is_neox=True)[0]
    assert bits(widened) == bits(out)


def test_bad_tables_are_refused():
    x = torch.zeros(1, 1, 16, dtype=F16)
    with pytest.raises(ValueError, match="even rotary_dim"):
        ref.apply_rope(x, torch.zeros(4, 3), positions(0))
    with pytest.raises(ValueError, match="even rotary_dim"):
        ref.apply_rope(x, torch.zeros(4, 18), positions(0))
    with pytest.raises(TypeError, match="cos_sin_cache must have dtype"):
        ref.apply_rope(x, torch.zeros(4, 16, dtype=torch.float64), positions(0))
    with pytest.raises(ValueError, match="rope_positions"):
        ref.apply_rope(x, torch.zeros(4, 16), positions(0, 1))


# ---------------------------------------------------------------------------------------------------------------
# FP8 Q
# ---------------------------------------------------------------------------------------------------------------

# (q16 value, q_scale, byte), by hand: E4M3 is s.eeee.mmm with bias 7, 0x7E = 448, subnormals m * 2**-9.
Q_FP8_CASES = [
    (0.0, 1.0, 0x00),
    (-0.0, 1.0, 0x80),
    (1.0, 1.0, 0x38),
    (1.0625, 1.0, 0x38),  # tie between 1.0 (0x38) and 1.125 (0x39): even
    (1.1875, 1.0, 0x3A),  # tie between 1.125 (0x39) and 1.25 (0x3A): even
    (-1.1875, 1.0, 0xBA),
    (1.125, 0.5, 0x41),  # 2.25 = 2 * 1.125
    (448.0, 1.0, 0x7E),
    (464.0, 1.0, 0x7E),  # halfway to the next step (480, the NaN code): saturates
    (480.0, 1.0, 0x7E),
    (-464.0, 1.0, 0xFE),
    (224.0, 0.25, 0x7E),  # 896 after the division
    (INF, 1.0, 0x7E),
    (-INF, 1.0, 0xFE),
    (NAN, 1.0, 0x7F),
    (-NAN, 1.0, 0x7F),
    (2.0**-9, 1.0, 0x01),  # smallest subnormal
    (2.0**-10, 1.0, 0x00),  # half of it: ties to even 0
    (-(2.0**-10), 1.0, 0x80),
    (3 * 2.0**-10, 1.0, 0x02),  # 1.5 steps: even 2
    (5 * 2.0**-10, 1.0, 0x02),  # 2.5 steps: even 2
    (7 * 2.0**-10, 1.0, 0x04),  # 3.5 steps: even 4
    (2.0**-6, 1.0, 0x08),  # smallest normal
    (3.0, 2.0, 0x3C),  # 1.5
]


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("value,q_scale,byte", Q_FP8_CASES)
def test_fp8_q_rounding(dtype, value, q_scale, byte):
    q16 = torch.tensor([value], dtype=dtype)
    assert math.isnan(value) or q16.item() == value  # every case is exact in both dtypes
    out = ref.quantize_q_fp8(q16, q_scale)
    assert out.dtype == torch.float8_e4m3fn
    assert out.view(torch.uint8).item() == byte, f"{value} / {q_scale}: {out.view(torch.uint8).item():#04x}"
    as_tensor = ref.quantize_q_fp8(q16, torch.tensor([q_scale], dtype=F32))
    assert as_tensor.view(torch.uint8).item() == byte


def test_fp8_q_divides_once_in_float32():
    """3 / (3 * 2**-7) = 128 = 2**7 (exponent field 14: 0x70); 1 / float32(1/3) = 2.99999991..., which rounds to
    3.0 in float32 (E4M3 1.5 * 2: 0x44)."""
    out = ref.quantize_q_fp8(torch.tensor([3.0], dtype=BF16), 3 * 2.0**-7)
    assert out.view(torch.uint8).item() == 0x70
    one_third = torch.tensor(1 / 3, dtype=F32).item()
    out = ref.quantize_q_fp8(torch.tensor([1.0], dtype=BF16), one_third)
    assert out.view(torch.uint8).item() == 0x44


# ---------------------------------------------------------------------------------------------------------------
# The fused reference: rotate, then append only the placed rows of a valid position
# ---------------------------------------------------------------------------------------------------------------


def one_page_caches(num_heads: int, head_dim: int, page_size: int = 4):
    """Zeroed NHD (k, v) caches of one page and their scale caches."""
    packed = tuple(torch.zeros(1, page_size, num_heads, head_dim // 2, dtype=torch.uint8) for _ in range(2))
    scales = tuple(torch.zeros(1, page_size, num_heads, head_dim // 16, dtype=torch.uint8) for _ in range(2))
    return packed, tuple(s.view(torch.float8_e4m3fn) for s in scales)


def fused_inputs(n: int = 4):
    """n rows of one head, D = 16: query = key = value = 1.0 everywhere; a 2-row table with cos = 0, sin = 1
    (a quarter turn) at position 0 and the identity at position 1."""
    ones = torch.ones(n, 1, 16, dtype=BF16)
    cos_sin = table([[0.0] * 8 + [1.0] * 8, [1.0] * 8 + [0.0] * 8])
    return ones.clone(), ones.clone(), ones.clone(), cos_sin


def test_fused_append_writes_rotated_k_and_unrotated_v_of_placed_valid_rows_only():
    """Row 0 (position 0, quarter turn) is placed at entry 2; row 1 has rope position -1 and row 2 == max_pos:
    neither is placed; row 3 is past nnz = 3 and not placed. Rotated K of row 0: dims 0..7 = 0 - 1 = -1,
    dims 8..15 = 0 + 1 = 1. With scale s = float32(1/6): 6 * s rounds to 1.0, t = 1 -> E4M3 0x38;
    r = 1 / (1 * s) rounds to 6.0 -> |y| = 6 -> code 7: K bytes 0xFF (-6, -6) for dims 0..7
    and 0x77 for dims 8..15; V: all 0x77."""
    query, key, value, cos_sin = fused_inputs()
    caches, scales = one_page_caches(1, 16)
    k_out = torch.full_like(key, 5.0)
    q = ref.rope_quantize_nvfp4_append_paged_kv_cache(
        query, key, value, cos_sin, positions(0, -1, 2, 1), positions(0, 0, 0), positions(2, 0, 1),
        caches, scales, positions(0), positions(0, 1), positions(3), 1 / 6, 1 / 6, "NHD", k_out=k_out,
    )  # fmt: skip
    k_cache, v_cache = caches
    assert k_cache[0, 2, 0].tolist() == [0xFF] * 4 + [0x77] * 4
    assert v_cache[0, 2, 0].tolist() == [0x77] * 8
    assert scales[0].view(torch.uint8)[0, 2, 0].tolist() == [0x38]
    assert scales[1].view(torch.uint8)[0, 2, 0].tolist() == [0x38]
    for entry in (0, 1, 3):  # the invalid rows would land at entries 0 and 1, row 3 is past nnz
        for cache in (*caches, *(s.view(torch.uint8) for s in scales)):
            assert cache[0, entry].eq(0).all(), entry
    assert q.dtype == BF16 and q.shape == query.shape
    assert q[0, 0].tolist() == [-1.0] * 8 + [1.0] * 8
    assert bits(q[1]) == [0] * 16 and bits(q[2]) == [0] * 16
    assert q[3, 0].tolist() == [1.0] * 16  # identity at position 1
    assert torch.equal(k_out, q)  # key == query here
    assert query.eq(1.0).all()  # query itself untouched


def test_fused_q_out_in_place_and_fp8():
    query, key, value, cos_sin = fused_inputs()
    caches, scales = one_page_caches(1, 16)
    args = (cos_sin, positions(0, -1, 2, 1), positions(0), positions(0), caches, scales, positions(0),
            positions(0, 1), positions(1), 1.0, 1.0)  # fmt: skip
    result = ref.rope_quantize_nvfp4_append_paged_kv_cache(query, key, value, *args, q_out=query)
    assert result is query
    assert query[0, 0].tolist() == [-1.0] * 8 + [1.0] * 8 and bits(query[1]) == [0] * 16
    fresh = fused_inputs()[0]
    fp8 = ref.rope_quantize_nvfp4_append_paged_kv_cache(
        fresh, key, value, *args, q_out_dtype=torch.float8_e4m3fn, q_scale=0.5
    )
    # -1 / 0.5 = -2 (0xC0), 1 / 0.5 = 2 (0x40); invalid rows +0; row 3 (identity) 2.
    assert fp8.dtype == torch.float8_e4m3fn
    assert fp8.view(torch.uint8)[:, 0].tolist() == [[0xC0] * 8 + [0x40] * 8, [0] * 16, [0] * 16, [0x40] * 16]
    given = torch.full((4, 1, 16), 0x11, dtype=torch.uint8).view(torch.float8_e4m3fn)
    into = ref.rope_quantize_nvfp4_append_paged_kv_cache(fresh, key, value, *args, q_out=given, q_scale=0.5)
    assert into is given and torch.equal(given.view(torch.uint8), fp8.view(torch.uint8))
    with pytest.raises(ValueError, match="q_scale"):
        ref.rope_quantize_nvfp4_append_paged_kv_cache(fresh, key, value, *args, q_scale=0.5)
    with pytest.raises(ValueError, match="q_scale"):
        ref.rope_quantize_nvfp4_append_paged_kv_cache(fresh, key, value, *args, q_out_dtype=torch.float8_e4m3fn)


def test_fused_slot_mapping_skips_padding_invalid_rows_and_rows_past_nnz():
    """Slots [3, -1, 0] for rows 0..2 (row 3 past nnz): row 0 (valid) lands at entry 3; row 1 is padding;
    row 2 has rope position 5 >= max_pos and is not written although its slot is 0."""
    query, key, value, cos_sin = fused_inputs()
    caches, scales = one_page_caches(1, 16)
    ref.rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
        query, key, value, cos_sin, positions(1, 0, 5, 0), positions(3, -1, 0), caches, scales, 1.0, 1.0
    )
    # Identity rotation: K = V = 1.0; s = 1: t = 1/6 -> E4M3 0.171875 = 1.375 * 2**-3 (exponent field 4, mantissa 3:
    # 0x23); r = 1 / 0.171875 = 5.818... > 5 -> code 7.
    for cache in caches:
        assert cache[0, 3, 0].tolist() == [0x77] * 8
        assert cache[0, :3].eq(0).all()
    for sf in scales:
        assert sf.view(torch.uint8)[0, 3, 0].tolist() == [0x23]
        assert sf.view(torch.uint8)[0, :3].eq(0).all()
