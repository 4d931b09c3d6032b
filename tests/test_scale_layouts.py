"""V-scale layouts ("linear", "trtllm") and the 4-over-6 scale search, through both append variants,
against the reference (which builds "trtllm" by reshape/permute), on every device present."""

import dataclasses
import enum
import itertools

import pytest
import torch
from conftest import assert_append_matches, assert_same_caches, compiled_error, page_geometry

import nvfp4kv
from nvfp4kv import reference

import rounding_hazards
from append_cases import cache_bytes, make_append_case

COMBOS = list(itertools.product(["NHD", "HND"], [False, True], ["linear", "trtllm"], ["none", "4over6"]))


@pytest.mark.parametrize("layout,stacked,v_sf_layout,scale_search", COMBOS)
def test_page_table_variant_matches_reference(device, layout, stacked, v_sf_layout, scale_search):
    seed = COMBOS.index((layout, stacked, v_sf_layout, scale_search))
    case = make_append_case(
        layout=layout,
        stacked=stacked,
        head_dim=128,
        page_size=8,
        num_heads=3,
        seed=100 + seed,
        dtype=torch.float16 if seed % 2 else torch.bfloat16,
    )
    assert_append_matches(case, device, v_sf_layout=v_sf_layout, scale_search=scale_search)


@pytest.mark.parametrize("layout,stacked,v_sf_layout,scale_search", COMBOS[::3])
def test_slot_mapping_variant_matches_reference(device, layout, stacked, v_sf_layout, scale_search):
    case = make_append_case(layout=layout, stacked=stacked, head_dim=64, page_size=4, seed=7)
    num_pages, _ = page_geometry(case)
    slots = torch.randperm(num_pages * 4, generator=torch.Generator().manual_seed(8))[: case.append_key.shape[0] - 1]
    slots[0] = -1
    ours, theirs = case.cloned().to(device), case.cloned()
    options = dict(v_sf_layout=v_sf_layout, scale_search=scale_search)
    for target, fn, s in (
        (ours, nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, slots.to(device)),
        (theirs, reference.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, slots),
    ):
        fn(
            target.append_key,
            target.append_value,
            s,
            target.paged_kv_cache,
            target.kv_cache_sf,
            target.k_scale,
            target.v_scale,
            target.kv_layout,
            **options,
        )
    assert_same_caches(ours, theirs)


@pytest.mark.parametrize("kind", ["gaussian", "outliers", "heavy_tail"])
def test_four_over_six_matches_reference_on_hard_inputs(device, kind):
    g = torch.Generator().manual_seed(9)
    case = make_append_case(head_dim=256, num_heads=2, page_size=16, seed=10)
    x = torch.randn(case.append_key.shape, generator=g)
    if kind == "outliers":
        x[..., torch.randint(0, 256, (8,), generator=g)] *= 40
    elif kind == "heavy_tail":
        x = x**3  # heavy tails: kurtosis far above a Gaussian's
    case = dataclasses.replace(case, append_key=x.to(torch.bfloat16), append_value=(-x).to(torch.bfloat16))
    assert_append_matches(case, device, scale_search="4over6")


def test_four_over_six_lowers_the_error_and_changes_some_scales():
    x = torch.randn(256, 8, 128, generator=torch.Generator().manual_seed(11))
    s = float(x.abs().max()) / (6 * 448)
    plain = reference.quantize(x, s)
    searched = reference.quantize(x, s, scale_search="4over6")
    error = lambda q: float((reference.dequantize(*q, s) - x).norm())  # noqa: E731
    assert error(searched) < error(plain)
    assert not torch.equal(plain[1].view(torch.uint8), searched[1].view(torch.uint8))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_trtllm_layout_offsets_by_hand(device, layout):
    """One row at entry t = 6 of page 1: V scale of block j lands at flat tile offset 4 S (t // 4) + 4 j + t % 4."""
    heads, head_dim, page_size = 2, 128, 8
    blocks = head_dim // 16
    inner = (page_size, heads) if layout == "NHD" else (heads, page_size)
    cache = torch.zeros(2, 2, *inner, head_dim // 2, dtype=torch.uint8, device=device)
    cache_sf = torch.zeros(2, 2, *inner, blocks, dtype=torch.uint8, device=device)
    row = torch.randn(1, heads, head_dim, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16).to(device)
    index = lambda *v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        row,
        row,
        index(0),
        index(6),
        cache,
        cache_sf.view(torch.float8_e4m3fn),
        index(1),
        index(0, 1),
        index(7),
        0.01,
        0.01,
        layout,
        v_sf_layout="trtllm",
    )
    k_sf, v_sf = cache_sf[1, 0].cpu(), cache_sf[1, 1].cpu()
    for h in range(heads):
        k_row = k_sf[6, h] if layout == "NHD" else k_sf[h, 6]
        tile = (v_sf[:, h] if layout == "NHD" else v_sf[h]).flatten()  # the (page, head) tile, row-major
        for j in range(blocks):  # K and V rows are the same values
            assert tile[4 * blocks * (6 // 4) + 4 * j + 6 % 4] == k_row[j], f"head {h}, block {j}"
        assert int((tile != 0).sum()) == int((k_row != 0).sum()), f"head {h}: more of the tile was written"


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_convert_v_scale_layout_round_trip_and_in_place(device, layout):
    g = torch.Generator().manual_seed(13)
    shape = (3, 8, 2, 8) if layout == "NHD" else (3, 2, 8, 8)
    linear = torch.randint(0, 127, shape, dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn).to(device)
    trtllm = nvfp4kv.convert_v_scale_layout(linear, "linear", "trtllm", kv_layout=layout)
    assert torch.equal(
        trtllm.view(torch.uint8).cpu(), reference.v_scales_linear_to_trtllm(linear.cpu(), layout).view(torch.uint8)
    )
    back = nvfp4kv.convert_v_scale_layout(trtllm, "trtllm", "linear", kv_layout=layout)
    assert torch.equal(back.view(torch.uint8), linear.view(torch.uint8))
    in_place = linear.clone()
    nvfp4kv.convert_v_scale_layout(in_place, "linear", "trtllm", kv_layout=layout, out=in_place)
    assert torch.equal(in_place.view(torch.uint8), trtllm.view(torch.uint8))
    if layout == "NHD":  # NHD "trtllm" transposed is the HND "trtllm" of the transposed linear tensor
        hnd = nvfp4kv.convert_v_scale_layout(linear.transpose(1, 2).contiguous(), kv_layout="HND")
        assert torch.equal(trtllm.transpose(-3, -2).view(torch.uint8), hnd.view(torch.uint8))


def test_readback_of_a_trtllm_cache(device):
    case = make_append_case(layout="HND", stacked=True, head_dim=64, page_size=4, seed=14).to(device)
    linear, trtllm = case.cloned(), case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*linear.args())
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*trtllm.args(), v_sf_layout="trtllm")
    read = lambda c, **kw: nvfp4kv.dequantize_paged_kv_cache(  # noqa: E731
        c.paged_kv_cache,
        c.kv_cache_sf,
        c.kv_indices,
        c.kv_indptr,
        c.kv_last_page_len,
        c.k_scale,
        c.v_scale,
        c.kv_layout,
        torch.float32,
        **kw,
    )
    k1, v1 = read(linear)
    k2, v2 = read(trtllm, v_sf_layout="trtllm")
    # Only the appended tokens hold the same values; the rest of each request is poison, read through
    # two different layouts.
    seq_lens = nvfp4kv.get_seq_lens(case.kv_indptr, case.kv_last_page_len, 4).long()
    starts = torch.cumsum(seq_lens, 0) - seq_lens
    rows = (starts[case.batch_indices.long()] + case.positions.long()).cpu()
    assert torch.equal(k1[rows], k2[rows])
    assert torch.equal(v1[rows], v2[rows])
    expected_v = reference.dequantize(*reference.quantize(case.append_value.cpu(), case.v_scale), case.v_scale)
    assert torch.equal(v2[rows].cpu(), expected_v)


class ErrMode(enum.IntEnum):
    """Stands in for FlashInfer's NVFP44Over6ErrMode (the API reads configs by their fields)."""

    MAE = 0
    MSE = 1


@dataclasses.dataclass(frozen=True)
class FourOverSixConfig:
    """Stands in for FlashInfer's NVFP44Over6Config, with its defaults."""

    e4m3_max: int = 448
    err_mode: object = ErrMode.MAE
    err_use_fast_math: bool = False


def append_by_slots(case, slots, **options) -> None:
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(case.append_key, case.append_value, slots,
        case.paged_kv_cache, case.kv_cache_sf, case.k_scale, case.v_scale, case.kv_layout, **options)  # fmt: skip


def slots_of(case) -> torch.Tensor:
    num_pages, page_size = page_geometry(case)
    return torch.randperm(num_pages * page_size, generator=torch.Generator().manual_seed(9))[: case.append_key.shape[0]]


@pytest.mark.parametrize(
    "config,scale_search,expected",
    [
        (FourOverSixConfig(err_mode=ErrMode.MSE), "none", "4over6"),
        (FourOverSixConfig(err_mode=ErrMode.MSE), "4over6", "4over6"),
        (FourOverSixConfig(err_mode="mse"), "none", "4over6"),
        (FourOverSixConfig(err_mode="MSE"), "none", "4over6"),
        (FourOverSixConfig(err_mode=1), "none", "4over6"),
        (FourOverSixConfig(e4m3_max=448.0, err_mode=ErrMode.MSE, err_use_fast_math=0), "none", "4over6"),
        (None, "none", "none"),
        (None, "4over6", "4over6"),
    ],
)
def test_nvfp4_4over6_config_gives_the_scale_search_bytes(device, config, scale_search, expected):
    """FlashInfer's nvfp4_4over6= of the slot-mapping append: MSE errors, exact, E4M3 maximum 448 is "4over6"."""
    case = make_append_case(head_dim=64, page_size=4, seed=17).to(device)
    slots = slots_of(case).to(device)
    ours, theirs = case.cloned(), case.cloned()
    append_by_slots(ours, slots, scale_search=scale_search, nvfp4_4over6=config)
    append_by_slots(theirs, slots, scale_search=expected)
    assert_same_caches(ours, theirs)


def test_nvfp4_4over6_config_under_compile():
    torch._dynamo.reset()
    case = make_append_case(head_dim=64, page_size=4, seed=18, stacked=True)
    slots = slots_of(case)
    ours, theirs = case.cloned(), case.cloned()
    compiled = torch.compile(nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, fullgraph=True)
    compiled(ours.append_key, ours.append_value, slots, ours.paged_kv_cache, ours.kv_cache_sf, ours.k_scale,
             ours.v_scale, ours.kv_layout, nvfp4_4over6=FourOverSixConfig(err_mode=ErrMode.MSE))  # fmt: skip
    append_by_slots(theirs, slots, scale_search="4over6")
    assert_same_caches(ours, theirs)


FOUR_OVER_SIX_BAD = [
    ("default_mae", FourOverSixConfig(), "none", ValueError, "nvfp4_4over6.err_mode must be MSE", "ErrMode.MAE"),
    ("mae_string", FourOverSixConfig(err_mode="mae"), "none", ValueError, "nvfp4_4over6.err_mode must be MSE", "'mae'"),
    ("mae_value", FourOverSixConfig(err_mode=0), "none", ValueError, "nvfp4_4over6.err_mode must be MSE", "got 0"),
    ("unknown_mode", FourOverSixConfig(err_mode="l1"), "none", ValueError, "nvfp4_4over6.err_mode must be MSE", "'l1'"),
    ("e4m3_max_256", FourOverSixConfig(e4m3_max=256, err_mode="mse"), "none", ValueError,
     "nvfp4_4over6.e4m3_max must be 448", "got 256"),
    ("fast_math", FourOverSixConfig(err_mode="mse", err_use_fast_math=True), "none", ValueError,
     "nvfp4_4over6.err_use_fast_math must be False", "got True"),
    ("conflicting_scale_search", FourOverSixConfig(err_mode="mse"), "4over5", ValueError,
     'scale_search must be "none" or "4over6" when nvfp4_4over6 is given', "got '4over5'"),
    ("not_a_config", "4over6", "none", TypeError, "nvfp4_4over6 must be None or an NVFP44Over6Config", "got str"),
]  # fmt: skip


@pytest.mark.parametrize(
    "config,scale_search,error,expected,given",
    [b[1:] for b in FOUR_OVER_SIX_BAD],
    ids=[b[0] for b in FOUR_OVER_SIX_BAD],
)
def test_nvfp4_4over6_refusals_name_the_field(config, scale_search, error, expected, given):
    case = make_append_case(head_dim=64, page_size=4, seed=19)
    before = cache_bytes(case.kv_cache_sf)
    with pytest.raises(error) as refused:
        append_by_slots(case, slots_of(case), scale_search=scale_search, nvfp4_4over6=config)
    message = str(refused.value)
    assert message.startswith(f"nvfp4kv.append_paged_kv_cache_with_slot_mapping: {expected}"), message
    assert message.endswith(given), message
    assert torch.equal(cache_bytes(case.kv_cache_sf), before)


BAD = [
    ("v_sf_layout_name", dict(v_sf_layout="interleaved"), {}, "v_sf_layout must be"),
    ("scale_search_name", dict(scale_search="4over5"), {}, "scale_search must be"),
    ("trtllm_page_size", dict(v_sf_layout="trtllm"), dict(page_size=6), "needs page_size % 4 == 0"),
    ("trtllm_head_dim", dict(v_sf_layout="trtllm"), dict(head_dim=48), "needs head_dim % 64 == 0"),
    (
        "trtllm_hnd_strided_tiles",
        dict(v_sf_layout="trtllm"),
        dict(layout="HND", strided_cache=True),
        "must have contiguous [page_size, head_dim/16] tiles",
    ),
]


@pytest.mark.parametrize("options,case_options,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_layout_options(options, case_options, message):
    case = make_append_case(**{"head_dim": 64, "page_size": 8, "seed": 15, **case_options})
    before = cache_bytes(case.kv_cache_sf)
    with pytest.raises(ValueError) as eager:
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args(), **options)
    assert message in str(eager.value)
    assert torch.equal(cache_bytes(case.kv_cache_sf), before)
    assert compiled_error(nvfp4kv.nvfp4_quantize_append_paged_kv_cache, *case.args(), **options) == str(eager.value)


def test_trtllm_needs_equal_k_and_v_scale_strides():
    case = make_append_case(head_dim=64, page_size=8, seed=16)
    k_sf, v_sf = case.kv_cache_sf
    v_strided = torch.zeros(v_sf.shape[0], v_sf.shape[1], v_sf.shape[2], 8, dtype=torch.uint8)[..., :4].view(
        torch.float8_e4m3fn
    )
    bad = dataclasses.replace(case, kv_cache_sf=(k_sf.contiguous(), v_strided))
    with pytest.raises(ValueError, match=r"kv_cache_sf\[1\] must have the same strides as the K scales"):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*bad.args(), v_sf_layout="trtllm")


# (input significand bits, tau, n, scale byte) of rounding_hazards.find_hazard, for K and V.
HAZARDS = {
    torch.bfloat16: ((8, 5, 201, 0x38), (8, 6, 233, 0x30)),
    torch.float16: ((11, 4, 1111, 0x30), (11, 5, 1703, 0x38)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale_search", ["none", "4over6"])
def test_codes_round_the_rounded_product(device, dtype, scale_search):
    """Global scales whose reciprocal r for one scale byte makes RN(x r) land exactly on a rounding
    boundary that x r misses (tests/rounding_hazards.py), and blocks with that scale byte holding such
    an x: SPEC rounds RN(x r), so a kernel that rounds the exact product (x * r contracted into an FMA)
    writes other bytes. One call of > 2^16 blocks per tensor (the CUDA pair kernel), K and V each with
    its own such scale."""
    k_hazard, v_hazard = (rounding_hazards.find_hazard(*h) for h in HAZARDS[dtype])
    case = make_append_case(head_dim=128, num_heads=8, batch_size=16, max_tokens=400, seed=80, dtype=dtype)
    case = dataclasses.replace(case, k_scale=k_hazard.s, v_scale=v_hazard.s)
    assert case.append_key.shape[0] * 8 * 128 // 16 > 1 << 16
    g = torch.Generator().manual_seed(81)
    for rows, hazard in ((case.append_key, k_hazard), (case.append_value, v_hazard)):
        blocks = rounding_hazards.hazard_blocks(hazard, dtype, 82, scale_search)
        assert blocks.shape[0] >= 4, "the hazard must give blocks with its scale byte"
        flat = rows.view(-1, 16)
        flat[torch.randperm(flat.shape[0], generator=g)[:4096]] = blocks[torch.arange(4096) % blocks.shape[0]]
    assert_append_matches(case, device, scale_search=scale_search)
