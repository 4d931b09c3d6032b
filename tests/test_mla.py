"""The MLA latent appends (docs/SPEC.md section 4) against the pure-PyTorch reference, on every device.

Every test compares whole caches (poisoned with random bytes) with the reference's, so a byte written in
the wrong place, or not written, fails; on CUDA the CPU op's bytes must match too. Besides the fixed geometries,
random calls (hypothesis, conftest.FUZZ) cover any latent and RoPE widths, page sizes and cache forms.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from conftest import FUZZ, assert_no_synchronisation_or_allocation, has_cuda, seed_of
from hypothesis import assume, given
from hypothesis import strategies as st
from torch._inductor.utils import run_and_get_code

import nvfp4kv
from nvfp4kv import reference_mla

from mla_cases import MlaCase, make_mla_case

OP = "append_paged_mla_kv_cache"


def assert_mla_matches(case: MlaCase, device: str, slot_mapping: bool = False, what: str = "") -> MlaCase:
    """Appends the CPU case on `device` and with the reference, each into its own copy, and compares every
    cache byte (on CUDA the CPU op's bytes too). Returns the case appended on `device`."""
    ours = case.to(device)
    sides = [(ours, nvfp4kv), (case.cloned(), reference_mla)]
    if device != "cpu":
        sides.append((case.cloned(), nvfp4kv))
    for side, module in sides:
        if slot_mapping:
            module.nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
                side.append_ckv, side.append_kpe, side.slot_mapping(), *side.caches(), side.ckv_scale, side.kpe_scale
            )
        else:
            module.nvfp4_quantize_append_paged_mla_kv_cache(*side.args())
    expected = sides[1][0].cache_bytes()
    for side, label in zip([s for s, _ in sides if s is not sides[1][0]], (device, "cpu")):
        got = side.cache_bytes()
        assert torch.equal(got, expected), f"{what} {label} vs reference: {int((got != expected).sum())} bytes differ"
    return ours


# (C, R, page_size); the last two give a lane more than one ckv block and kpe pair (C > 512, R > 64)
GEOMETRIES = [(512, 64, 64), (512, 64, 16), (64, 16, 8), (32, 24, 4), (16, 1, 1), (528, 66, 8), (1024, 128, 16)]


@pytest.mark.parametrize("ckv_dim,kpe_dim,page_size", GEOMETRIES)
@pytest.mark.parametrize("decode", [False, True])
def test_matches_reference(ckv_dim, kpe_dim, page_size, decode, device):
    seed = seed_of(ckv_dim, kpe_dim, page_size, decode)
    case = make_mla_case(ckv_dim=ckv_dim, kpe_dim=kpe_dim, page_size=page_size, decode=decode, seed=seed)
    assert_mla_matches(case, device, what=f"seed {seed}")


def test_large_call_matches_reference(device):
    """A call of more than 4096 rows with an odd row count (CUDA runs its chain kernel: many CTAs, a partial
    last one)."""
    case = make_mla_case(batch_size=41, max_tokens=400, page_size=64, seed=32)
    assert case.append_ckv.shape[0] >= 4096 and case.append_ckv.shape[0] % 2 == 1, case.append_ckv.shape
    assert_mla_matches(case, device, what="seed 32")
    assert_mla_matches(case, device, slot_mapping=True, what="seed 32, slots")


@st.composite
def random_calls(draw) -> tuple:
    """make_mla_case's options beyond GEOMETRIES (any C of 16-value blocks up to 1024, any R up to 130, page sizes
    that do not divide the tokens, every input and cache form) and whether the call takes slots. A pool holds a
    16-bit kpe cache only where make_mla_case can align it: with the FP8 kpe cache."""
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    kpe_cache_dtype = draw(st.sampled_from([torch.float8_e4m3fn, dtype]))
    case = dict(
        ckv_dim=16 * draw(st.integers(1, 64)),
        kpe_dim=draw(st.integers(1, 130)),
        page_size=draw(st.sampled_from([1, 2, 3, 8, 16, 64])),
        batch_size=draw(st.integers(1, 4)),
        max_tokens=draw(st.integers(1, 50)),
        decode=draw(st.booleans()),
        dtype=dtype,
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        projection=draw(st.booleans()),
        pool=kpe_cache_dtype == torch.float8_e4m3fn and draw(st.booleans()),
        kpe_cache_dtype=kpe_cache_dtype,
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    return case, draw(st.booleans())


@FUZZ
@given(random_call=random_calls())
def test_random_calls_match_reference(device, random_call):
    case_options, slot_mapping = random_call
    case = make_mla_case(**case_options)
    assume(case.ckv_scale > 0 and case.kpe_scale > 0)  # a few rows can be all zeros: no scale to calibrate
    assert_mla_matches(case, device, slot_mapping=slot_mapping)


FORMS = list(itertools.product([torch.bfloat16, torch.float16], [torch.int32, torch.int64], [False, True],
                               [False, True], [torch.float8_e4m3fn, "input"]))  # fmt: skip


@pytest.mark.parametrize("dtype,index_dtype,projection,pool,kpe_cache_dtype", FORMS)
def test_input_and_cache_forms(dtype, index_dtype, projection, pool, kpe_cache_dtype, device):
    """fp16/bf16, int32/int64 indices, ckv/kpe as halves of one projection, caches as slices of one pool,
    and a kpe cache of the inputs' dtype (a bit copy)."""
    seed = seed_of(dtype, index_dtype, projection, pool, kpe_cache_dtype)
    kpe_cache_dtype = dtype if kpe_cache_dtype == "input" else kpe_cache_dtype
    case = make_mla_case(dtype=dtype, index_dtype=index_dtype, projection=projection, pool=pool,
                         kpe_cache_dtype=kpe_cache_dtype, seed=seed)  # fmt: skip
    assert_mla_matches(case, device, what=f"seed {seed}")


@pytest.mark.parametrize("decode", [False, True])
def test_slot_mapping_matches_reference(decode, device):
    seed = seed_of("slots", decode)
    case = make_mla_case(decode=decode, seed=seed)
    ours = assert_mla_matches(case, device, slot_mapping=True, what=f"seed {seed}")
    # Padding (negative) and slots past the cache are skipped; rows past slot_mapping's length are ignored.
    slots = ours.slot_mapping().clone()
    slots[0] = -1
    slots[-1] = ours.ckv_cache.shape[0] * ours.ckv_cache.shape[1]
    before = ours.cache_bytes()
    expected = case.cloned()
    reference_mla.nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
        expected.append_ckv, expected.append_kpe, slots.cpu()[:-1], *expected.caches(), case.ckv_scale, case.kpe_scale
    )
    again = dataclasses.replace(ours, **dict(zip(("ckv_cache", "ckv_sf_cache", "kpe_cache"), case.to(device).caches())))
    nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
        again.append_ckv, again.append_kpe, slots[:-1], *again.caches(), case.ckv_scale, case.kpe_scale
    )
    assert torch.equal(again.cache_bytes(), expected.cache_bytes())
    assert before.numel() == expected.cache_bytes().numel()


def test_bad_rows_are_skipped(device):
    """Rows whose batch index, position or page falls outside the table or the cache write nothing."""
    case = make_mla_case(decode=True, batch_size=6, seed=3)
    n = case.batch_indices.numel()
    batch = case.batch_indices.clone()
    positions = case.positions.clone()
    batch[0] = -1
    batch[1] = n + 7
    positions[2] = -5
    positions[3] = 10**6
    indices = case.kv_indices.clone()
    indices[case.kv_indptr[4]] = case.ckv_cache.shape[0]  # page id past the cache
    bad = dataclasses.replace(case, batch_indices=batch, positions=positions, kv_indices=indices)
    assert_mla_matches(bad, device)


# (value, kpe_scale, byte): the E4M3 rounding of y = value / kpe_scale, computed by hand.
KPE_EDGES = [
    (0.0, 1.0, 0x00),
    (-0.0, 1.0, 0x80),
    (1.0, 1.0, 0x38),
    (1.0625, 1.0, 0x38),  # tie between 1.0 and 1.125: even
    (1.1875, 1.0, 0x3A),  # tie between 1.125 and 1.25: even
    (-1.1875, 1.0, 0xBA),
    (448.0, 1.0, 0x7E),
    (464.0, 1.0, 0x7E),  # tie between 448 and the NaN code: saturates
    (1000.0, 1.0, 0x7E),
    (-1000.0, 1.0, 0xFE),
    (float("inf"), 1.0, 0x7E),
    (float("-inf"), 1.0, 0xFE),
    (float("nan"), 1.0, 0x7F),
    (-float("nan"), 1.0, 0x7F),
    (2.0**-9, 1.0, 0x01),  # smallest subnormal
    (2.0**-10, 1.0, 0x00),  # half of it: ties to even 0
    (3 * 2.0**-10, 1.0, 0x02),  # 1.5 subnormal steps: even 2
    (2.0**-6, 1.0, 0x08),  # smallest normal
    (7 * 2.0**-10, 1.0, 0x04),  # 3.5 steps: even 4
    (3.0, 2.0, 0x3C),  # 1.5
    (1.0, 2.0**-126, 0x7E),  # y overflows fp32: inf -> 448
    (1.0, 3.0e38, 0x00),  # y underflows to 0
    (2.0**100, 2.0**100, 0x38),
]


def test_kpe_rounding_edge_cases(device):
    for dtype in (torch.bfloat16, torch.float16):
        for value, scale, byte in KPE_EDGES:
            x = torch.tensor(value, dtype=dtype)
            if float(x) != value and value == value and abs(value) != float("inf"):
                continue  # not representable in this dtype
            case = make_mla_case(ckv_dim=16, kpe_dim=16, page_size=4, decode=True, batch_size=1, dtype=dtype, seed=9)
            case.append_kpe = torch.full_like(case.append_kpe, value)
            case.kpe_scale = scale
            ours = assert_mla_matches(case, device, what=f"{dtype} {value} / {scale}")
            b, p = int(case.batch_indices[0]), int(case.positions[0])
            page = int(case.kv_indices[int(case.kv_indptr[b]) + p // 4])
            got = ours.kpe_cache.view(torch.uint8)[page, p % 4].cpu()
            assert got.tolist() == [byte] * 16, f"{dtype} {value} / {scale}: {got.tolist()[0]:#04x}, want {byte:#04x}"


def test_readback_decodes_through_the_documented_recipe(device):
    """dequantize_paged_mla_kv_cache equals an independent decode of the bytes (e2m1 * sf * ckv_scale,
    float(e4m3) * kpe_scale), and that decode is within NVFP4's / E4M3's rounding of the inputs."""
    case = make_mla_case(seed=21)
    ours = assert_mla_matches(case, device)
    ckv, kpe = nvfp4kv.dequantize_paged_mla_kv_cache(*ours.caches(), ours.kv_indices, ours.kv_indptr,
                                                     ours.kv_last_page_len, case.ckv_scale, case.kpe_scale,
                                                     out_dtype=torch.float32)  # fmt: skip
    # The rows of the request-ordered readback that this case appended (its rows are each request's last tokens).
    lengths = (case.kv_indptr[1:] - case.kv_indptr[:-1] - 1).clamp(min=0) * 16 + case.kv_last_page_len
    starts = torch.cumsum(lengths, 0) - lengths
    rows = (starts[case.batch_indices.long()] + case.positions.long()).to(ckv.device)
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    packed = ours.ckv_cache.cpu()
    b, p = case.batch_indices.long(), case.positions.long()
    pages = case.kv_indices.long()[case.kv_indptr.long()[b] + p // 16]
    data = packed[pages, p % 16]
    codes = torch.stack([data & 0xF, data >> 4], dim=-1).reshape(len(b), -1).long()
    values = e2m1[codes & 7] * (1 - 2 * (codes >> 3)).float()
    sf = ours.ckv_sf_cache.cpu()[pages, p % 16].float().repeat_interleave(16, dim=-1)
    decoded = values * sf * torch.tensor(case.ckv_scale)
    assert torch.equal(ckv[rows].cpu(), decoded)
    kpe_decoded = ours.kpe_cache.cpu()[pages, p % 16].float() * torch.tensor(case.kpe_scale)
    assert torch.equal(kpe[rows].cpu(), kpe_decoded)
    x = case.append_ckv.float().reshape(len(b), -1, 16)
    block_max = x.abs().amax(dim=-1, keepdim=True)
    assert bool(((decoded.reshape_as(x) - x).abs() <= 0.1875 * block_max + 1e-30).all())
    y = case.append_kpe.float()
    within = (kpe_decoded - y).abs() <= 2.0**-4 * y.abs() + 2.0**-10 * case.kpe_scale
    saturated = (y.abs() / case.kpe_scale) > 448
    assert bool((within | saturated).all())


BAD = [
    ("ckv_float32", lambda c: dict(append_ckv=c.append_ckv.float()), "append_ckv"),
    ("ckv_3d", lambda c: dict(append_ckv=c.append_ckv[:, None]), "append_ckv"),
    ("ckv_dim_24", lambda c: dict(append_ckv=c.append_ckv[:, :24]), "append_ckv"),
    ("ckv_not_contiguous", lambda c: dict(append_ckv=c.append_ckv.repeat(1, 2)[:, ::2]), "append_ckv"),
    ("kpe_dtype", lambda c: dict(append_kpe=c.append_kpe.half()), "append_kpe"),
    ("kpe_rows", lambda c: dict(append_kpe=c.append_kpe[1:]), "append_kpe"),
    ("ckv_cache_dtype", lambda c: dict(ckv_cache=c.ckv_cache.view(torch.int8)), "ckv_cache"),
    ("ckv_cache_width", lambda c: dict(ckv_cache=c.ckv_cache[..., :-2]), "ckv_cache"),
    ("sf_pages", lambda c: dict(ckv_sf_cache=c.ckv_sf_cache[1:]), "ckv_sf_cache"),
    ("sf_dtype", lambda c: dict(ckv_sf_cache=c.ckv_sf_cache.view(torch.uint8)), "ckv_sf_cache"),
    ("kpe_cache_width", lambda c: dict(kpe_cache=c.kpe_cache[..., :-1]), "kpe_cache"),
    ("kpe_cache_float16", lambda c: dict(kpe_cache=torch.zeros(c.kpe_cache.shape, dtype=torch.float16)), "kpe_cache"),
    ("ckv_scale_negative", lambda c: dict(ckv_scale=-1.0), "ckv_scale"),
    ("kpe_scale_nan", lambda c: dict(kpe_scale=float("nan")), "kpe_scale"),
    ("kpe_scale_inf", lambda c: dict(kpe_scale=float("inf")), "kpe_scale"),
    ("batch_float", lambda c: dict(batch_indices=c.batch_indices.float()), "batch_indices"),
    ("positions_count", lambda c: dict(positions=c.positions[1:]), "positions"),
    ("indptr_count", lambda c: dict(kv_indptr=c.kv_indptr[1:]), "kv_indptr"),
    ("sf_over_ckv", lambda c: dict(ckv_sf_cache=c.ckv_cache[..., : c.ckv_sf_cache.shape[-1]].view(torch.float8_e4m3fn)),
     "ckv_sf_cache"),
    ("kpe_over_sf", lambda c: dict(kpe_cache=c.ckv_cache[..., : c.kpe_cache.shape[-1]].view(torch.float8_e4m3fn)),
     "kpe_cache"),
    ("ckv_inside_cache", lambda c: dict(append_ckv=c.ckv_cache.view(-1)[: c.append_ckv.numel() * 2].view(
        torch.bfloat16).view(c.append_ckv.shape)), "append_ckv"),
]  # fmt: skip


@pytest.mark.parametrize("mutate,argument", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_named_and_writes_nothing(mutate, argument, device):
    case = make_mla_case(seed=5)
    bad = dataclasses.replace(case, **mutate(case)).to(device)
    before = bad.cache_bytes()
    with pytest.raises(ValueError) as error:
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*bad.args())
    message = str(error.value)
    assert message.startswith(f"nvfp4kv.{OP}: {argument} "), message
    assert ", got " in message, message
    assert torch.equal(bad.cache_bytes(), before)


def test_wrong_python_types_are_named():
    case = make_mla_case(seed=6)
    with pytest.raises(TypeError, match=f"nvfp4kv.{OP}: kpe_scale must be a float"):
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*case.args()[:-1], None)
    with pytest.raises(TypeError, match=f"nvfp4kv.{OP}: kpe_cache must be a torch.Tensor"):
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*dataclasses.replace(case, kpe_cache=[1]).args())


def test_device_scales_are_read_on_the_device_and_bad_ones_skip(device):
    case = make_mla_case(seed=8)
    ours = case.to(device)
    tensor = lambda v: torch.tensor([v], dtype=torch.float32, device=device)  # noqa: E731
    nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*ours.args()[:-2], tensor(case.ckv_scale), tensor(case.kpe_scale))
    expected = case.cloned()
    reference_mla.nvfp4_quantize_append_paged_mla_kv_cache(*expected.args())
    assert torch.equal(ours.cache_bytes(), expected.cache_bytes())
    # A scale tensor that is not positive and finite leaves its part of every row untouched.
    skipped = case.to(device)
    before = [t.clone() for t in skipped.caches()]
    nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*skipped.args()[:-2], tensor(float("nan")), tensor(case.kpe_scale))
    assert torch.equal(skipped.ckv_cache, before[0]) and torch.equal(skipped.ckv_sf_cache.view(torch.uint8),
                                                                      before[1].view(torch.uint8))  # fmt: skip
    assert torch.equal(skipped.kpe_cache.view(torch.uint8).cpu(), expected.kpe_cache.view(torch.uint8))


def test_compiled_fullgraph_equals_eager(device):
    torch._dynamo.reset()
    compiled = torch.compile(nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache, fullgraph=True, dynamic=True)
    for seed in (1, 2):
        case = make_mla_case(seed=seed, decode=seed == 2)
        ours = case.to(device)
        compiled(*ours.args())
        eager = case.to(device)
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*eager.args())
        assert torch.equal(ours.cache_bytes(), eager.cache_bytes()), f"seed {seed}"


def test_compile_refuses_pool_slices():
    """Caches sharing a storage are refused under compile (PyTorch miscompiles mutated aliased inputs); torch
    before 2.13 refuses these (views of other dtypes) itself, before the API's check can run."""
    torch._dynamo.reset()
    compiled = torch.compile(nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache, fullgraph=True)
    case = make_mla_case(pool=True, seed=4)
    before = case.cache_bytes()
    refusals = "shares its storage with ckv_cache|does not yet handle input mutations on views with different dtypes"
    with pytest.raises(Exception, match=refusals):
        compiled(*case.args())
    assert torch.equal(case.cache_bytes(), before)


def test_opcheck():
    case = make_mla_case(seed=11)
    op = torch.ops.nvfp4kv.append_paged_mla_kv_cache.default
    args = (*case.args(), None, None)
    # test_schema compares float8 tensors with arithmetic torch lacks for float8; these are the ones that run.
    torch.library.opcheck(
        op, args, test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    )


def test_torchscript_equals_eager():
    @torch.jit.script
    def scripted(ckv, kpe, batch, positions, ckv_cache, sf_cache, kpe_cache, indices, indptr, last,
                 ckv_scale: float, kpe_scale: float):  # fmt: skip
        torch.ops.nvfp4kv.append_paged_mla_kv_cache(
            ckv, kpe, batch, positions, ckv_cache, sf_cache, kpe_cache, indices, indptr, last, ckv_scale, kpe_scale
        )

    case = make_mla_case(seed=12)
    ours, expected = case.cloned(), case.cloned()
    scripted(*ours.args())
    reference_mla.nvfp4_quantize_append_paged_mla_kv_cache(*expected.args())
    assert torch.equal(ours.cache_bytes(), expected.cache_bytes())


def test_debug_mode_names_a_bad_row():
    case = make_mla_case(seed=13)
    case.positions = case.positions.clone()
    case.positions[1] = -3
    nvfp4kv.set_debug_checks(True)
    try:
        with pytest.raises(ValueError, match=rf"nvfp4kv.{OP} \(debug check\): row 1: position -3 is negative"):
            nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*case.args())
    finally:
        nvfp4kv.set_debug_checks(False)


def forced_mode_cases():
    """(label, case, slot_mapping) for the forced-kernel test: every geometry, decode and prefill, the input and
    cache forms, bad rows, and indices of mixed dtypes (read element by element)."""
    for c, r, page_size in GEOMETRIES:
        for decode in (False, True):
            seed = seed_of(c, r, page_size, decode)
            case = make_mla_case(ckv_dim=c, kpe_dim=r, page_size=page_size, decode=decode, seed=seed)
            yield f"C{c} R{r} page {page_size} decode {decode}", case, False
    for dtype, index_dtype, projection, pool, kpe in FORMS[::3]:
        kpe = dtype if kpe == "input" else kpe
        label = f"{dtype} {index_dtype} projection {projection} pool {pool} kpe {kpe}"
        case = make_mla_case(dtype=dtype, index_dtype=index_dtype, projection=projection, pool=pool,
                             kpe_cache_dtype=kpe, seed=seed_of(label))  # fmt: skip
        yield label, case, False
        yield label + " slots", case, True
    bad = make_mla_case(decode=True, batch_size=6, seed=3)
    bad.batch_indices[0], bad.positions[2] = -1, 10**6
    bad.kv_indices[bad.kv_indptr[4]] = bad.ckv_cache.shape[0]
    yield "bad rows", bad, False
    mixed = make_mla_case(batch_size=5, seed=21)
    yield "int64 positions", dataclasses.replace(mixed, positions=mixed.positions.long()), False
    yield "int64 indptr", dataclasses.replace(mixed, kv_indptr=mixed.kv_indptr.long()), False
    for batch in (63, 64):  # kv_indptr in the chain warp's lanes (at most 64 entries) or read per row
        few = make_mla_case(batch_size=batch, max_tokens=3, seed=batch)
        assert few.batch_indices.numel() != batch, "a decode-shaped call would take the other path"
        few.batch_indices[:3] = torch.tensor([batch, -1, 1 << 30])  # past the batch, negative, far past
        yield f"batch {batch}", few, False
    many = make_mla_case(batch_size=9, max_tokens=120, seed=23)  # 18 chain-kernel CTAs, the last partial
    assert many.append_ckv.shape[0] > 16 * 16 and many.append_ckv.shape[0] % 16, many.append_ckv.shape
    yield "many CTAs", many, False
    yield "many CTAs slots", many, True


@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU and a build with the CUDA kernels")
@pytest.mark.parametrize("forced_kernel_mode", ["split", "pair"], indirect=True)
def test_each_cuda_kernel_matches_reference(forced_kernel_mode):
    """The row kernel ("split") and the chain kernel ("pair") each give the reference's bytes on every kind
    of case, whichever the call's size would choose."""
    for label, case, slot_mapping in forced_mode_cases():
        assert_mla_matches(case, "cuda", slot_mapping=slot_mapping, what=f"{forced_kernel_mode} {label}")
    scales = make_mla_case(seed=8).to("cuda")
    tensor = lambda v: torch.tensor([v], dtype=torch.float32, device="cuda")  # noqa: E731
    expected = make_mla_case(seed=8)
    reference_mla.nvfp4_quantize_append_paged_mla_kv_cache(*expected.args())
    nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*scales.args()[:-2], tensor(scales.ckv_scale),
                                                     tensor(scales.kpe_scale))  # fmt: skip
    assert torch.equal(scales.cache_bytes(), expected.cache_bytes()), f"{forced_kernel_mode} device scales"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_replay_reads_device_scales():
    if not nvfp4kv.library.has_cuda_kernels():
        pytest.skip("no CUDA kernels in this build")
    case = make_mla_case(seed=14, decode=True)
    ours = case.to("cuda")
    ckv_scale = torch.tensor([case.ckv_scale], device="cuda")
    kpe_scale = torch.tensor([case.kpe_scale], device="cuda")
    args = (*ours.args()[:-2], ckv_scale, kpe_scale)
    nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*args)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*args)
    ckv_scale.fill_(case.ckv_scale * 2)
    kpe_scale.fill_(case.kpe_scale * 2)
    graph.replay()
    torch.cuda.synchronize()
    expected = case.cloned()
    reference_mla.nvfp4_quantize_append_paged_mla_kv_cache(*expected.args()[:-2], case.ckv_scale * 2,
                                                           case.kpe_scale * 2)  # fmt: skip
    assert torch.equal(ours.cache_bytes(), expected.cache_bytes())


def test_compiled_op_writes_the_caches_in_place():
    """Inductor calls the op once on the graph inputs: no clone, copy or fresh buffer stands in for a cache."""
    torch._dynamo.reset()
    case, eager = make_mla_case(seed=15), make_mla_case(seed=15)
    compiled = torch.compile(nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache, fullgraph=True)
    _, codes = run_and_get_code(compiled, *case.args())
    nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*eager.args())
    assert torch.equal(case.cache_bytes(), eager.cache_bytes())
    code = "\n".join(codes)
    assert sum("torch.ops.nvfp4kv.append_paged_mla_kv_cache" in line for line in code.splitlines()) == 1, code
    assert "copy_" not in code and "clone" not in code, code


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_no_synchronisation_and_no_allocation_on_cuda():
    if not nvfp4kv.library.has_cuda_kernels():
        pytest.skip("no CUDA kernels in this build")
    case = make_mla_case(decode=True, batch_size=8, seed=16).to("cuda")
    ckv_scale = torch.tensor([case.ckv_scale], device="cuda")
    slots = case.slot_mapping()  # built before the measured calls (it allocates)

    def calls():
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*case.args())
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*case.args()[:-2], ckv_scale, case.kpe_scale)
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
            case.append_ckv, case.append_kpe, slots, *case.caches(), case.ckv_scale, case.kpe_scale
        )

    assert_no_synchronisation_or_allocation(calls)
