"""Tests of the reference oracle's optional formats: the "trtllm" V-scale layout and 4-over-6 block scales
(SPEC extensions D and C).

Expected values come from SPEC's offset formula written out with Python loops, from hand arithmetic, and from
a per-block implementation with numpy float32 scalars, element by element; never from the code under test.
"""

import math

import numpy as np
import pytest
import torch

from reference_source import codes_of, load_reference, scale_bytes

ref = load_reference("nvfp4kv_reference_layouts_under_test")

NAN = math.nan
INF = math.inf
F32 = torch.float32
F8 = torch.float8_e4m3fn


def random_bytes(shape, seed):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------------------------
# "trtllm" V-scale layout
# ---------------------------------------------------------------------------------------------------------------


def trtllm_by_offset_formula(linear: torch.Tensor, kv_layout: str) -> torch.Tensor:
    """SPEC's offset formula (extension D), one byte at a time.

    HND: the byte of (t, j) goes to off(t, j) = 4*S*(t // 4) + 4*j + (t % 4) of the contiguous [T, S] tile.
    NHD: u = 4*j + (t % 4), row = 4*(t // 4) + u // S, col = u % S, stored at [page, row, h, col].
    """
    out = torch.zeros_like(linear)
    if kv_layout == "HND":
        pages, heads, tokens, blocks = linear.shape
    else:
        pages, tokens, heads, blocks = linear.shape
    for page in range(pages):
        for h in range(heads):
            for t in range(tokens):
                for j in range(blocks):
                    if kv_layout == "HND":
                        offset = 4 * blocks * (t // 4) + 4 * j + (t % 4)
                        out[page, h, offset // blocks, offset % blocks] = linear[page, h, t, j]
                    else:
                        u = 4 * j + (t % 4)
                        row, col = 4 * (t // 4) + u // blocks, u % blocks
                        out[page, row, h, col] = linear[page, t, h, j]
    return out


def layout_shape(kv_layout, pages, tokens, heads, blocks):
    return (pages, heads, tokens, blocks) if kv_layout == "HND" else (pages, tokens, heads, blocks)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("tokens, blocks", [(4, 4), (8, 4), (4, 8), (16, 8), (12, 12)])
def test_trtllm_layout_matches_the_offset_formula(kv_layout, tokens, blocks):
    linear = random_bytes(layout_shape(kv_layout, 2, tokens, 3, blocks), seed=tokens * 100 + blocks)
    expected = trtllm_by_offset_formula(linear, kv_layout)
    converted = ref.v_scales_linear_to_trtllm(linear, kv_layout)
    assert converted.dtype == torch.uint8 and converted.shape == linear.shape
    assert torch.equal(converted, expected)
    assert torch.equal(ref.v_scales_trtllm_to_linear(expected, kv_layout), linear)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_trtllm_conversions_invert_each_other_and_keep_float8(kv_layout):
    storage = random_bytes(layout_shape(kv_layout, 3, 8, 2, 8), seed=7)
    v_sf = storage.view(F8)
    there = ref.v_scales_linear_to_trtllm(v_sf, kv_layout)
    assert there.dtype == F8 and there.shape == v_sf.shape
    assert torch.equal(ref.v_scales_trtllm_to_linear(there, kv_layout).view(torch.uint8), storage)
    back = ref.v_scales_trtllm_to_linear(v_sf, kv_layout)
    assert torch.equal(ref.v_scales_linear_to_trtllm(back, kv_layout).view(torch.uint8), storage)
    # The permutation moves bytes: neither direction is the identity, and the inputs are not modified.
    assert not torch.equal(there.view(torch.uint8), storage) and not torch.equal(back.view(torch.uint8), storage)
    assert torch.equal(v_sf.view(torch.uint8), random_bytes(storage.shape, seed=7))


def test_trtllm_nhd_is_the_transpose_of_hnd():
    linear_nhd = random_bytes((2, 16, 3, 8), seed=8)
    nhd = ref.v_scales_linear_to_trtllm(linear_nhd, "NHD")
    hnd = ref.v_scales_linear_to_trtllm(linear_nhd.transpose(-3, -2), "HND")
    assert torch.equal(nhd.transpose(-3, -2), hnd)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_trtllm_conversion_of_a_strided_half_of_a_stacked_cache(kv_layout):
    stacked = random_bytes((2, 2) + layout_shape(kv_layout, 1, 8, 2, 4)[1:], seed=9)  # [pages, 2, ...]
    v_sf = stacked[:, 1]
    converted = ref.v_scales_linear_to_trtllm(v_sf, kv_layout)
    assert torch.equal(converted, trtllm_by_offset_formula(v_sf.contiguous(), kv_layout))
    assert converted.data_ptr() != v_sf.data_ptr()


@pytest.mark.parametrize("conversion", [ref.v_scales_linear_to_trtllm, ref.v_scales_trtllm_to_linear])
def test_trtllm_conversion_rejects_bad_shapes(conversion):
    with pytest.raises(ValueError, match="page_size"):
        conversion(torch.zeros(2, 6, 2, 4, dtype=torch.uint8), "NHD")
    with pytest.raises(ValueError, match="page_size"):
        conversion(torch.zeros(2, 2, 6, 4, dtype=torch.uint8), "HND")
    with pytest.raises(ValueError, match="head_dim"):
        conversion(torch.zeros(2, 8, 2, 2, dtype=torch.uint8), "NHD")  # head_dim 32
    with pytest.raises(ValueError, match="kv_layout"):
        conversion(torch.zeros(2, 8, 2, 4, dtype=torch.uint8), "NDH")
    with pytest.raises(ValueError, match="4-D"):
        conversion(torch.zeros(8, 2, 4, dtype=torch.uint8), "NHD")
    with pytest.raises(TypeError, match="dtype"):
        conversion(torch.zeros(2, 8, 2, 4, dtype=torch.float16), "NHD")


# ---------------------------------------------------------------------------------------------------------------
# 4-over-6: a per-block implementation in numpy float32 scalars
# ---------------------------------------------------------------------------------------------------------------


def e4m3_value(code: int) -> float:
    exponent, mantissa = code >> 3, code & 0x7
    return mantissa * 2.0**-9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)


E4M3 = [e4m3_value(code) for code in range(0x7F)]  # 0x00..0x7E = 0 .. 448
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nearest_code(value: float, grid: list) -> int:
    """Index of the nearest grid value, ties to the even index, past the end saturating. Midpoints of these grids
    have at most 6 significant bits, so every comparison below is exact in float64."""
    for code in range(len(grid) - 1):
        midpoint = (grid[code] + grid[code + 1]) / 2
        if value < midpoint:
            return code
        if value == midpoint:
            return code if code % 2 == 0 else code + 1
    return len(grid) - 1


def e4m3_code(t: np.float32) -> int:
    return 0x7E if not t < 448 else nearest_code(float(t), E4M3)


def e2m1_code(magnitude: np.float32) -> int:
    return 7 if math.isnan(magnitude) else nearest_code(float(magnitude), E2M1)


def quantize_block_by_hand(block: list, global_scale: float, scale_search: str, accumulate: str = "fp32"):
    """(scale code, 16 element codes) of one block, every step a numpy float32 scalar operation.

    accumulate="fp32" is SPEC's squared error (extension C); the others are the mistakes a kernel could make, to show
    that test blocks tell them apart: "float64" (error summed in double), "reversed" (elements 15..0), "fused"
    (acc = fma(d, d, acc): d * d + acc rounded once; exact here because d * d fits a double and the sum does too).
    """
    x = [np.float32(v) for v in block]
    s = np.float32(global_scale)
    if any(math.isnan(v) for v in x):
        return 0x7F, [0] * 16
    a = max(abs(v) for v in x)

    def candidate(multiplier):
        t = a / (np.float32(multiplier) * s)
        scale_code = e4m3_code(t)
        sf = np.float32(E4M3[scale_code])
        r = np.float32(0.0) if a == 0 or sf == 0 else np.float32(1.0) / (sf * s)
        codes = [(8 if math.copysign(1.0, float(v)) < 0 else 0) | e2m1_code(abs(v * r)) for v in x]
        differences = []
        for v, code in zip(x, codes):
            value = np.float32(-E2M1[code & 7] if code & 8 else E2M1[code & 7])
            differences.append((value * sf) * s - v)
        error = np.float32(0.0)
        if accumulate == "float64":
            return scale_code, codes, sum(float(d) * float(d) for d in differences)
        for d in reversed(differences) if accumulate == "reversed" else differences:
            error = np.float32(float(d) * float(d) + float(error)) if accumulate == "fused" else error + d * d
        return scale_code, codes, error

    with np.errstate(all="ignore"):
        scale_6, codes_6, error_6 = candidate(6.0)
        if scale_search == "none":
            return scale_6, codes_6
        scale_4, codes_4, error_4 = candidate(4.0)
    return (scale_4, codes_4) if error_4 < error_6 else (scale_6, codes_6)


def quantize_one(block, global_scale=1.0, scale_search="4over6", dtype=F32):
    packed, scales = ref.quantize(torch.tensor(block, dtype=dtype), global_scale, scale_search=scale_search)
    return scale_bytes(scales)[0], codes_of(packed)


ZEROS = [0.0] * 14


def test_4over6_hand_computed_block_where_sf4_wins():
    # s = 1, a = 6. sf6 = E4M3(1) = 1.0 (0x38): 4.5 -> y = 4.5 -> code 6 (4.0), error 0.25.
    # sf4 = E4M3(6 / 4) = 1.5 (0x3C): r = f32(1 / 1.5) = 0.6666667; y(6) = f32(4.00000012) = 4 -> code 6 -> 4 * 1.5
    # = 6; y(4.5) = f32(3.00000009) = 3 -> code 5 -> 3 * 1.5 = 4.5: error 0 < 0.25, so sf4 wins.
    block = [6.0, -4.5] + ZEROS
    assert quantize_one(block, scale_search="none") == (0x38, [0x7, 0xE] + [0] * 14)
    assert quantize_one(block) == (0x3C, [0x6, 0xD] + [0] * 14)
    packed, scales = ref.quantize(torch.tensor(block), 1.0, scale_search="4over6")
    assert ref.dequantize(packed, scales, 1.0).tolist() == block


def test_4over6_hand_computed_block_where_sf6_wins():
    # sf6 = 1.0 represents 6 and 1 exactly (error 0); with sf4 = 1.5, y(1) = 0.6666667 -> code 1 -> 0.75 (error
    # 0.0625), so sf6 stays.
    assert quantize_one([6.0, 1.0] + ZEROS) == (0x38, [0x7, 0x2] + [0] * 14)


def test_4over6_tie_keeps_sf6():
    # sf6 = 1.0: y(1.25) = 1.25 is a tie -> code 2 (1.0), error 0.0625.
    # sf4 = 1.5: y(1.25) = f32(0.83333336) -> code 2 -> 1.5, error 0.0625; y(6) -> 6 exactly. Equal errors: sf6.
    assert quantize_one([6.0, 1.25] + ZEROS) == (0x38, [0x7, 0x2] + [0] * 14)
    # With a global scale: the same block times s = 0.25 (all exact) ties the same way.
    assert quantize_one([1.5, 0.3125] + ZEROS, global_scale=0.25) == (0x38, [0x7, 0x2] + [0] * 14)


def test_4over6_all_zero_blocks_keep_sf6():
    assert quantize_one([0.0] * 16) == (0x00, [0] * 16)
    assert quantize_one([-0.0] * 16) == (0x00, [8] * 16)


def test_4over6_nan_block_rule_still_applies():
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(48, generator=generator) * 3
    x[21] = NAN
    x[22] = INF
    packed, scales = ref.quantize(x, 0.5, scale_search="4over6")
    assert scale_bytes(scales)[1] == 0x7F and packed[8:16].tolist() == [0] * 8
    for block in (0, 2):
        alone = quantize_one(x[16 * block : 16 * block + 16].tolist(), global_scale=0.5)
        assert (scale_bytes(scales)[block], codes_of(packed[8 * block : 8 * block + 8])) == alone, f"block {block}"


def test_4over6_infinite_block_keeps_sf6():
    # a = inf: both candidates saturate to 448 and the errors are both inf: a tie.
    assert quantize_one([INF, 1.0] + ZEROS, scale_search="none") == quantize_one([INF, 1.0] + ZEROS)


def test_4over6_default_and_none_are_the_plain_recipe():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(11))
    plain, plain_scales = ref.quantize(x, 0.3)
    explicit, explicit_scales = ref.quantize(x, 0.3, scale_search="none")
    assert torch.equal(plain, explicit) and scale_bytes(plain_scales) == scale_bytes(explicit_scales)
    with pytest.raises(ValueError, match="scale_search"):
        ref.quantize(x, 0.3, scale_search="4over8")


def random_blocks(seed):
    """[n, 16] float32 blocks of several kinds: Gaussian, outliers, heavy tails, tiny and clustered values."""
    generator = torch.Generator().manual_seed(seed)
    n = 80
    gaussian = torch.randn(n, 16, generator=generator)
    outliers = torch.randn(n, 16, generator=generator)
    outlier_at = torch.randint(0, 16, (n,), generator=generator)
    outliers[torch.arange(n), outlier_at] *= 20 + 30 * torch.rand(n, generator=generator)
    heavy_tail = torch.randn(n, 16, generator=generator) / torch.rand(n, 16, generator=generator).clamp(min=0.05)
    tiny = torch.randn(n, 16, generator=generator) * 2.0 ** torch.randint(-30, -8, (n, 1), generator=generator)
    clustered = (1 + 0.3 * torch.rand(n, 16, generator=generator)) * torch.sign(torch.randn(n, 16, generator=generator))
    return torch.cat([gaussian, outliers, heavy_tail, tiny, clustered]).to(F32)


@pytest.mark.parametrize("global_scale, dtype", [(1.0, F32), (0.037, torch.bfloat16), (1.3, torch.float16)])
def test_4over6_random_blocks_match_the_per_block_implementation(global_scale, dtype):
    blocks = random_blocks(seed=12).to(dtype)
    packed, scales = ref.quantize(blocks, global_scale, scale_search="4over6")
    plain_packed, plain_scales = ref.quantize(blocks, global_scale)
    got_scales = scale_bytes(scales)
    sf4_wins = 0
    for i, block in enumerate(blocks.to(F32).tolist()):
        expected = quantize_block_by_hand(block, global_scale, "4over6")
        assert (got_scales[i], codes_of(packed[i])) == expected, (i, block)
        sf4_wins += got_scales[i] != scale_bytes(plain_scales[i])[0]
    assert 0 < sf4_wins < blocks.shape[0]  # both candidates win somewhere

    # The chosen candidate never has a larger error than the plain recipe (checked in float64).
    def error(p, sc):
        return ((ref.dequantize(p, sc, global_scale).double() - blocks.double()) ** 2).sum(dim=-1)

    assert (error(packed, scales) <= error(plain_packed, plain_scales) * (1 + 1e-5)).all()


# Near-tie blocks (s = 1, a = 6, so sf6 = 1.0 and sf4 = 1.5), found by a search over one element's float32 ulps:
# on each, SPEC's fp32 forward sum and at least one of a float64 sum, a reversed sum or a fused multiply-add
# pick different scales.
NEAR_TIE_BLOCKS = [  # float32 values in hex, 16 per block
    "0x1.800000p+2 0x1.1a8210p+2 0x1.bd95fcp+1 0x1.f5241ep+1 0x1.34a900p-2 0x1.4be112p+2 0x1.6765dcp+2 0x1.d0c1d0p-1"
    " 0x1.4dee46p+2 0x1.ab92fcp-1 0x1.e34d6ap+0 0x1.694a90p+2 0x1.6e17acp-1 0x1.6e2fbcp+2 0x1.47f12cp-1 0x1.c6074cp-1",
    "0x1.800000p+2 0x1.32473ap+1 0x1.a5f080p-4 0x1.03539ep+2 0x1.8eba22p+1 0x1.049700p+1 0x1.0d9000p+2 0x1.17fdc8p+0"
    " 0x1.e4c260p+0 0x1.6c7b9cp+2 0x1.20528ep+2 0x1.b03750p+1 0x1.364094p+1 0x1.d5e4c8p-2 0x1.543d26p+2 0x1.1ce99ep+1",
    "0x1.800000p+2 0x1.3b19e6p+2 0x1.043062p+2 0x1.df072ap+1 0x1.33dc3cp+1 0x1.082a40p+1 0x1.c12a0ap+1 0x1.1a5bd6p+0"
    " 0x1.b6fd88p+1 0x1.94da50p+0 0x1.7ebb04p+2 0x1.883670p+1 0x1.57c784p+2 0x1.dd96a2p+1 0x1.6c19b6p+2 0x1.2ec76ap+2",
    "0x1.800000p+2 0x1.1a8210p+2 0x1.bd95fcp+1 0x1.f5241ep+1 0x1.34a900p-2 0x1.4be112p+2 0x1.6765dcp+2 0x1.d0c1cep-1"
    " 0x1.4dee46p+2 0x1.ab92fcp-1 0x1.e34d6ap+0 0x1.694a90p+2 0x1.6e17acp-1 0x1.6e2fbcp+2 0x1.47f12cp-1 0x1.c6074cp-1",
    "0x1.800000p+2 0x1.5e5cecp+1 0x1.10a518p+2 0x1.74e0e8p+1 0x1.7a907ep+0 0x1.88c778p+1 0x1.710e70p-3 0x1.992208p-1"
    " 0x1.00c026p+0 0x1.5e1e2ap+2 0x1.693fc6p+2 0x1.fb22cep+0 0x1.9138f8p+1 0x1.15a0b4p+2 0x1.ae0288p+1 0x1.7f6c0ap+0",
    "0x1.800000p+2 0x1.29b070p+0 0x1.d1aa8cp+1 0x1.e87bb4p+1 0x1.1538a8p+2 0x1.f21dfcp+1 0x1.456c30p+1 0x1.c2baa2p-1"
    " 0x1.3a3a94p+2 0x1.7cb554p+1 0x1.0198d4p+0 0x1.659430p+2 0x1.2b0c98p+2 0x1.48cff8p-1 0x1.80729cp+0 0x1.faa570p+0",
    "0x1.800000p+2 0x1.af3b44p-1 0x1.f3f668p+0 0x1.581b20p+2 0x1.526052p+2 0x1.3a82dap+2 0x1.bf01aap+0 0x1.8d5150p-1"
    " 0x1.87aa54p-1 0x1.4a50e8p+0 0x1.5362bcp+2 0x1.1348a0p-1 0x1.211a98p+1 0x1.d182e0p+1 0x1.3330c8p+0 0x1.d982bap+1",
]


def test_4over6_near_ties_follow_the_fp32_forward_sum():
    blocks = [[float.fromhex(h) for h in block.split()] for block in NEAR_TIE_BLOCKS]
    packed, scales = ref.quantize(torch.tensor(blocks, dtype=F32), 1.0, scale_search="4over6")
    caught = set()
    for i, block in enumerate(blocks):
        expected = quantize_block_by_hand(block, 1.0, "4over6")
        assert (scale_bytes(scales)[i], codes_of(packed[i])) == expected, i
        for mistake in ("float64", "reversed", "fused"):
            if quantize_block_by_hand(block, 1.0, "4over6", accumulate=mistake)[0] != expected[0]:
                caught.add(mistake)
    assert caught == {"float64", "reversed", "fused"}
    assert {0x38, 0x3C} == set(scale_bytes(scales))  # both scales are chosen among them


def test_plain_recipe_random_blocks_match_the_per_block_implementation():
    # The reference's plain recipe (SPEC section 2) on random blocks of every kind, element by element.
    blocks = random_blocks(seed=13)[::4]
    packed, scales = ref.quantize(blocks, 0.7)
    for i, block in enumerate(blocks.tolist()):
        assert (scale_bytes(scales)[i], codes_of(packed[i])) == quantize_block_by_hand(block, 0.7, "none"), i


# ---------------------------------------------------------------------------------------------------------------
# Paged append with v_sf_layout and scale_search
# ---------------------------------------------------------------------------------------------------------------

PAGE_SIZE, HEADS, HEAD_DIM, MAX_NUM_PAGES = 8, 2, 64, 5
S = HEAD_DIM // 16
K_SCALE, V_SCALE = 0.5, 0.125

# (batch index, position) rows over three requests; the last two are skipped (past the request, bad batch).
KV_INDICES = [3, 0, 4, 1]
KV_INDPTR = [0, 2, 3, 4]
KV_LAST_PAGE_LEN = [3, 5, 8]
ROWS = [(0, 9), (0, 10), (0, 0), (1, 4), (1, 0), (2, 7), (2, 3), (1, 8), (3, 0)]


def target_slots():
    """(row, page, entry) of every row per SPEC section 1; rows outside their request are skipped."""
    slots = []
    for row, (b, p) in enumerate(ROWS):
        if not 0 <= b < len(KV_LAST_PAGE_LEN):
            continue
        page_iter = KV_INDPTR[b] + p // PAGE_SIZE
        if page_iter < KV_INDPTR[b + 1]:
            slots.append((row, KV_INDICES[page_iter], p % PAGE_SIZE))
    return slots


def make_caches(kv_layout, form, seed):
    """Random-poisoned (packed, scales) storages; returns the uint8 storages and the op arguments."""
    shape = {"NHD": (MAX_NUM_PAGES, PAGE_SIZE, HEADS), "HND": (MAX_NUM_PAGES, HEADS, PAGE_SIZE)}[kv_layout]
    storages, arguments = [], []
    for last_dim, dtype in ((HEAD_DIM // 2, torch.uint8), (S, F8)):
        if form == "tuple":
            storage = [random_bytes(shape + (last_dim,), seed + 2 * last_dim + kv) for kv in range(2)]
            arguments.append(tuple(t.view(dtype) for t in storage))
        else:
            storage = random_bytes(shape[:1] + (2,) + shape[1:] + (last_dim,), seed + last_dim)
            arguments.append(storage.view(dtype))
        storages.append(storage)
    return storages, arguments


def halves(storage):
    return (storage[0], storage[1]) if isinstance(storage, list) else (storage[:, 0], storage[:, 1])


def append(variant, kv_layout, key, value, arguments, **options):
    if variant == "page_table":
        ref.nvfp4_quantize_append_paged_kv_cache(
            key, value, torch.tensor([b for b, _ in ROWS], dtype=torch.int32),
            torch.tensor([p for _, p in ROWS], dtype=torch.int32), arguments[0], arguments[1],
            torch.tensor(KV_INDICES, dtype=torch.int32), torch.tensor(KV_INDPTR, dtype=torch.int32),
            torch.tensor(KV_LAST_PAGE_LEN, dtype=torch.int32), K_SCALE, V_SCALE, kv_layout, **options,
        )  # fmt: skip
    else:
        slots = [-1] * len(ROWS)
        for row, page, entry in target_slots():
            slots[row] = page * PAGE_SIZE + entry
        ref.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            key, value, torch.tensor(slots), arguments[0], arguments[1], K_SCALE, V_SCALE, kv_layout, **options
        )


def at(tensor, kv_layout, page, token, head):
    return tensor[page, token, head] if kv_layout == "NHD" else tensor[page, head, token]


@pytest.mark.parametrize("variant", ["page_table", "slot_mapping"])
@pytest.mark.parametrize("form", ["tuple", "stacked"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_append_trtllm_4over6_writes_exactly_the_target_bytes(variant, form, kv_layout):
    generator = torch.Generator().manual_seed(14)
    kv = (torch.randn(len(ROWS), 2, HEADS, HEAD_DIM, generator=generator) * 2).to(torch.bfloat16)
    key, value = kv[:, 0], kv[:, 1]
    (packed, scales), arguments = make_caches(kv_layout, form, seed=20)
    (poison_packed, poison_scales), _ = make_caches(kv_layout, form, seed=20)
    append(variant, kv_layout, key, value, arguments, v_sf_layout="trtllm", scale_search="4over6")

    # Expected bytes, one target at a time: packed data and K scales at their linear slots, V scales of (t, j)
    # at SPEC's offset formula inside the (page, head) tile.
    expected_k, expected_v = (t.clone() for t in halves(poison_packed))
    expected_k_sf, expected_v_sf = (t.clone() for t in halves(poison_scales))
    differs_from_plain = [False, False]
    for row, page, entry in target_slots():
        for h in range(HEADS):
            for kv_index, (x, scale, cache, sf_cache) in enumerate(
                [(key, K_SCALE, expected_k, expected_k_sf), (value, V_SCALE, expected_v, expected_v_sf)]
            ):
                row_packed, row_scales = ref.quantize(x[row, h], scale, scale_search="4over6")
                _, plain_scales = ref.quantize(x[row, h], scale)
                differs_from_plain[kv_index] |= scale_bytes(row_scales) != scale_bytes(plain_scales)
                at(cache, kv_layout, page, entry, h).copy_(row_packed)
                if kv_index == 0:
                    at(sf_cache, kv_layout, page, entry, h).copy_(row_scales.view(torch.uint8))
                    continue
                for j, byte in enumerate(scale_bytes(row_scales)):
                    if kv_layout == "HND":
                        offset = 4 * S * (entry // 4) + 4 * j + (entry % 4)
                        sf_cache[page, h, offset // S, offset % S] = byte
                    else:
                        u = 4 * j + (entry % 4)
                        sf_cache[page, 4 * (entry // 4) + u // S, h, u % S] = byte
    assert all(differs_from_plain)  # scale_search reached both K and V

    for got, expected in zip(halves(packed) + halves(scales), (expected_k, expected_v, expected_k_sf, expected_v_sf)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_append_trtllm_equals_linear_append_converted(kv_layout):
    kv = (torch.randn(len(ROWS), 2, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(15)) * 5).half()
    key, value = kv[:, 0], kv[:, 1]
    (packed_t, scales_t), arguments_t = make_caches(kv_layout, "tuple", seed=30)
    (packed_l, scales_l), arguments_l = make_caches(kv_layout, "tuple", seed=30)
    # The linear run starts from the same V-scale cache contents, read in the linear layout.
    scales_l[1].copy_(ref.v_scales_trtllm_to_linear(scales_l[1], kv_layout))

    append("page_table", kv_layout, key, value, arguments_t, v_sf_layout="trtllm", scale_search="4over6")
    append("page_table", kv_layout, key, value, arguments_l, v_sf_layout="linear", scale_search="4over6")
    assert torch.equal(packed_t[0], packed_l[0]) and torch.equal(packed_t[1], packed_l[1])
    assert torch.equal(scales_t[0], scales_l[0])
    assert torch.equal(scales_t[1], ref.v_scales_linear_to_trtllm(scales_l[1], kv_layout))


def test_append_rejects_bad_options_before_writing():
    kv = torch.randn(len(ROWS), HEADS, HEAD_DIM).half()
    (packed, scales), arguments = make_caches("NHD", "tuple", seed=40)
    before = [t.clone() for t in packed + scales]
    with pytest.raises(ValueError, match="v_sf_layout"):
        append("page_table", "NHD", kv, kv, arguments, v_sf_layout="interleaved")
    with pytest.raises(ValueError, match="scale_search"):
        append("slot_mapping", "NHD", kv, kv, arguments, scale_search="best")

    # head_dim 32 and page_size 6 cannot hold the "trtllm" layout; the K side is not written either.
    narrow = torch.randn(len(ROWS), HEADS, 32).half()
    narrow_arguments = (
        (torch.zeros(5, 8, HEADS, 16, dtype=torch.uint8),) * 2,
        (torch.zeros(5, 8, HEADS, 2, dtype=F8),) * 2,
    )
    with pytest.raises(ValueError, match="head_dim"):
        append("slot_mapping", "NHD", narrow, narrow, narrow_arguments, v_sf_layout="trtllm")
    assert (narrow_arguments[0][0] == 0).all()
    short = ((torch.zeros(5, 6, HEADS, 32, dtype=torch.uint8),) * 2, (torch.zeros(5, 6, HEADS, 4, dtype=F8),) * 2)
    with pytest.raises(ValueError, match="page_size"):
        ref.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            kv, kv, torch.arange(len(ROWS)), short[0], short[1], 1.0, 1.0, v_sf_layout="trtllm"
        )
    assert (short[0][0] == 0).all()
    assert all(torch.equal(t, b) for t, b in zip(packed + scales, before))
