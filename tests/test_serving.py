"""The serving-engine surface: slot mapping, device-tensor scales, debug mode, readback, calibration.
Every test runs on each device present (CPU in CI; CUDA as well on a GPU machine)."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import assert_same_caches, compiled_error, has_cuda, page_geometry, seed_of
from torch._subclasses.fake_tensor import FakeTensorMode

import nvfp4kv
from nvfp4kv import reference
from nvfp4kv.fp4_quantization import e2m1_and_ufp8sf_scale_to_float

from append_cases import cache_bytes, make_append_case
from mla_cases import MlaCase, make_mla_case


def slot_mapping_for(case, generator, padding=True, out_of_range=True, extra_rows=2):
    """Slots of the case's rows, with padding (-1) rows, slots past the cache, and fewer slots than rows."""
    num_pages, page_size = page_geometry(case)
    nnz = case.append_key.shape[0]
    n = max(nnz - extra_rows, 1)
    slots = torch.randperm(num_pages * page_size, generator=generator)[:n]
    if padding and n > 2:
        slots[torch.randint(0, n, (2,), generator=generator)] = -1
    if out_of_range and n > 3:
        slots[torch.randint(0, n, (1,), generator=generator)] = num_pages * page_size + 7
    return slots.to(case.kv_indices.dtype)


def slot_args(case, slots, k_scale=None, v_scale=None):
    return (
        case.append_key,
        case.append_value,
        slots,
        case.paged_kv_cache,
        case.kv_cache_sf,
        case.k_scale if k_scale is None else k_scale,
        case.v_scale if v_scale is None else v_scale,
        case.kv_layout,
    )


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_slot_mapping_matches_reference(device, layout, stacked, index_dtype):
    g = torch.Generator().manual_seed(seed_of(layout, stacked, index_dtype))
    case = make_append_case(
        layout=layout,
        stacked=stacked,
        index_dtype=index_dtype,
        head_dim=80,
        page_size=5,
        strided_input=stacked,
        seed=int(torch.randint(0, 1000, (1,), generator=g)),
    )
    slots = slot_mapping_for(case, g)
    ours, theirs = case.cloned().to(device), case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(ours, slots.to(device)))
    reference.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(theirs, slots))
    assert_same_caches(ours, theirs)


def test_slot_mapping_writes_exactly_the_slot(device):
    """Hand-placed: slot 2 * page_size + 3 is page 2, entry 3; the padding row writes nothing."""
    case = make_append_case(layout="HND", page_size=4, head_dim=32, num_heads=2, seed=30).to(device)
    before = case.cloned()
    slots = torch.tensor([2 * 4 + 3, -1], device=device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(case, slots))
    packed, scales = reference.quantize(case.append_key[0].cpu(), case.k_scale)
    k_after, k_before = case.paged_kv_cache[0].cpu(), before.paged_kv_cache[0].cpu()
    assert torch.equal(k_after[2, :, 3], packed)
    assert torch.equal(case.kv_cache_sf[0].cpu()[2, :, 3].view(torch.uint8), scales.view(torch.uint8))
    k_after[2, :, 3] = k_before[2, :, 3]
    assert torch.equal(k_after, k_before)


@pytest.mark.parametrize("variant", ["page_table", "slot_mapping"])
@pytest.mark.parametrize("global_scale", [None, 1e-30, 3e30])
def test_tensor_scales_give_the_float_scale_bytes(device, variant, global_scale):
    """Extreme scales take the IEEE division instead of the reciprocal of 6 s (CUDA)."""
    case = make_append_case(seed=31, stacked=True, global_scale=global_scale).to(device)
    k_tensor = torch.tensor([case.k_scale], dtype=torch.float32, device=device)
    v_tensor = torch.tensor([case.v_scale], dtype=torch.float32, device=device)
    with_floats, with_tensors = case.cloned(), case.cloned()
    if variant == "page_table":
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*with_floats.args())
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            *dataclasses.replace(with_tensors, k_scale=k_tensor, v_scale=v_tensor).args()
        )
    else:
        slots = slot_mapping_for(case, torch.Generator().manual_seed(1)).to(device)
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(with_floats, slots))
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            *slot_args(with_tensors, slots, k_tensor, v_tensor)
        )
    assert_same_caches(with_floats, with_tensors)
    assert not torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(with_floats.paged_kv_cache))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_tensor_scale_leaves_its_rows_untouched(device, bad):
    """K with a bad device scale is skipped; V (good scale) is still written, exactly as usual."""
    case = make_append_case(seed=32, stacked=False).to(device)
    expected = case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*expected.args())
    trial = case.cloned()
    k_tensor = torch.tensor([bad], dtype=torch.float32, device=device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*dataclasses.replace(trial, k_scale=k_tensor).args())
    for name in ("paged_kv_cache", "kv_cache_sf"):
        untouched, written = getattr(case, name), getattr(expected, name)
        got = getattr(trial, name)
        assert torch.equal(got[0].cpu().view(torch.uint8), untouched[0].cpu().view(torch.uint8)), "K was written"
        assert torch.equal(got[1].cpu().view(torch.uint8), written[1].cpu().view(torch.uint8)), "V differs"


@pytest.mark.parametrize(
    "tensor,expected",
    [
        (lambda d: torch.tensor([0.5], dtype=torch.float64, device=d), "dtype float64"),
        (lambda d: torch.tensor([0.5, 0.5], device=d), "shape [2]"),
        (lambda d: torch.tensor([0.5], device="meta"), "device meta"),
    ],
)
def test_tensor_scale_metadata_is_checked(tensor, expected):
    case = make_append_case(seed=33)
    before = cache_bytes(case.paged_kv_cache)
    bad = dataclasses.replace(case, v_scale=tensor("cpu"))
    with pytest.raises(
        ValueError,
        match=r"nvfp4kv\.append_paged_kv_cache: v_scale as a tensor must be a "
        r"one-element float32 tensor on append_key's device \(cpu\)",
    ) as error:
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*bad.args())
    assert expected in str(error.value)
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)


SLOT_BAD_CASES = [
    ("slot_float", lambda c, s: (c, s.float()), "slot_mapping"),
    ("slot_2d", lambda c, s: (c, s[None]), "slot_mapping"),
    ("slot_too_long", lambda c, s: (c, torch.cat([s, s, s, s])), "slot_mapping"),
    ("layout", lambda c, s: (dataclasses.replace(c, kv_layout="XYZ"), s), "kv_layout"),
    ("key_dtype", lambda c, s: (dataclasses.replace(c, append_key=c.append_key.float()), s), "append_key"),
    ("k_scale", lambda c, s: (dataclasses.replace(c, k_scale=0.0), s), "k_scale"),
    (
        "sf_dtype",
        lambda c, s: (dataclasses.replace(c, kv_cache_sf=(c.kv_cache_sf[0].view(torch.uint8), c.kv_cache_sf[1])), s),
        "kv_cache_sf[0]",
    ),
]


@pytest.mark.parametrize("mutate,argument", [c[1:] for c in SLOT_BAD_CASES], ids=[c[0] for c in SLOT_BAD_CASES])
def test_slot_mapping_bad_input(mutate, argument):
    case = make_append_case(seed=34)
    slots = slot_mapping_for(case, torch.Generator().manual_seed(2))
    bad_case, bad_slots = mutate(case, slots)
    before = cache_bytes(case.paged_kv_cache)
    with pytest.raises(ValueError) as eager:
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(bad_case, bad_slots))
    message = str(eager.value)
    assert message.startswith(f"nvfp4kv.append_paged_kv_cache_with_slot_mapping: {argument} "), message
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)
    assert (
        compiled_error(nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, *slot_args(bad_case, bad_slots))
        == message
    )


def test_slot_mapping_compiles_without_cache_copies():
    torch._dynamo.reset()
    case = make_append_case(seed=35, stacked=True)
    slots = slot_mapping_for(case, torch.Generator().manual_seed(3))
    eager = case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(eager, slots))
    k_tensor = torch.tensor([case.k_scale])

    @torch.compile(fullgraph=True)
    def step(key, value, slots, cache, cache_sf, k_scale):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            key, value, slots, cache, cache_sf, k_scale, case.v_scale, "NHD"
        )

    step(case.append_key, case.append_value, slots, case.paged_kv_cache, case.kv_cache_sf, k_tensor)
    assert_same_caches(case, eager)


def test_opcheck_slot_mapping():
    case = make_append_case(seed=36, stacked=True, head_dim=32, num_heads=2)
    slots = slot_mapping_for(case, torch.Generator().manual_seed(4))
    torch.library.opcheck(
        torch.ops.nvfp4kv.append_paged_kv_cache_with_slot_mapping.default,
        (
            case.append_key,
            case.append_value,
            slots,
            case.paged_kv_cache,
            None,
            case.kv_cache_sf,
            None,
            case.k_scale,
            case.v_scale,
            "NHD",
            torch.tensor([case.k_scale]),
            None,
        ),
        test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"),
    )


# ---------------------------------------------------------------- debug mode


@pytest.fixture
def debug_mode():
    nvfp4kv.set_debug_checks(True)
    yield
    nvfp4kv.set_debug_checks(False)


def test_debug_mode_accepts_valid_calls(device, debug_mode):
    case = make_append_case(seed=37).to(device)
    expected = case.cloned()
    nvfp4kv.set_debug_checks(False)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*expected.args())
    nvfp4kv.set_debug_checks(True)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
    assert_same_caches(case, expected)


@pytest.mark.parametrize(
    "corrupt,message",
    [
        (
            lambda c: setattr(
                c,
                "batch_indices",
                torch.where(torch.arange(c.batch_indices.numel()) == 3, 99, c.batch_indices.cpu()).to(c.batch_indices),
            ),
            r"row 3: batch index 99 is outside \[0, 3\)",
        ),
        (
            lambda c: setattr(
                c,
                "positions",
                torch.where(torch.arange(c.positions.numel()) == 2, -5, c.positions.cpu()).to(c.positions),
            ),
            r"row 2: position -5 is negative",
        ),
        (
            lambda c: setattr(
                c,
                "positions",
                torch.where(torch.arange(c.positions.numel()) == 1, 10**6, c.positions.cpu()).to(c.positions),
            ),
            r"row 1: position 1000000 is beyond request \d+'s sequence length \d+",
        ),
        (
            lambda c: setattr(c, "kv_indices", torch.full_like(c.kv_indices, 10**5)),
            r"row 0: kv_indices\[\d+\] = 100000 is outside the cache's pages \[0, \d+\)",
        ),
        (
            lambda c: setattr(c, "k_scale", torch.tensor([float("nan")], device=c.append_key.device)),
            r"k_scale tensor holds nan, not a positive finite scale, so the K rows would be skipped",
        ),
    ],
)
def test_debug_mode_names_the_first_bad_row(device, corrupt, message, debug_mode):
    case = make_append_case(seed=38, batch_size=3, max_tokens=30).to(device)
    corrupt(case)
    before = cache_bytes(case.paged_kv_cache)
    with pytest.raises(ValueError, match=r"^nvfp4kv\.append_paged_kv_cache \(debug check\): " + message):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)


def test_debug_mode_slot_beyond_cache(device, debug_mode):
    case = make_append_case(seed=39).to(device)
    num_pages, page_size = page_geometry(case)
    slots = torch.tensor([0, -1, num_pages * page_size], device=device)
    with pytest.raises(ValueError, match=r"row 2: slot \d+ is beyond the cache"):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(case, slots))


def test_debug_mode_from_environment():
    code = "import nvfp4kv, nvfp4kv.debug_checks as d; print(d.enabled())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "NVFP4KV_DEBUG": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "True"


@pytest.mark.skipif(not has_cuda(), reason="needs CUDA graph capture")
def test_debug_mode_refuses_graph_capture(debug_mode):
    case = make_append_case(seed=40).to("cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot run during CUDA graph capture"):
        with torch.cuda.graph(graph):
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())


# ---------------------------------------------------------------- CPU tensor scales with CUDA inputs

SCALE_VARIANTS = ["page_table", "slot_mapping", "mla", "mla_slot_mapping"]


def scale_case(variant: str, seed: int):
    """A CPU case of the variant: an MlaCase for the MLA appends, else an AppendCase."""
    return make_mla_case(seed=seed) if variant.startswith("mla") else make_append_case(seed=seed, stacked=True)


def float_scales(case) -> tuple:
    return (case.ckv_scale, case.kpe_scale) if isinstance(case, MlaCase) else (case.k_scale, case.v_scale)


def variant_slots(variant: str, case):
    """The slot mapping of a slot-mapping variant's case (None for the page-table variants); no slot past the
    cache, so that debug checks pass it and the scale is what a call is refused for."""
    if variant == "slot_mapping":
        slots = slot_mapping_for(case, torch.Generator().manual_seed(5), out_of_range=False)
        return slots.to(case.append_key.device)
    return case.slot_mapping() if variant == "mla_slot_mapping" else None


def append_with_scales(variant: str, case, first, second, slots=None) -> None:
    """Appends `case` with the variant's op and the two global scales given (K and V, or ckv and kpe); `slots`:
    variant_slots(variant, case), computed here when not given."""
    slots = variant_slots(variant, case) if slots is None else slots
    if variant == "page_table":
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*dataclasses.replace(case, k_scale=first, v_scale=second).args())
    elif variant == "slot_mapping":
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(*slot_args(case, slots, first, second))
    elif variant == "mla":
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache(*case.args()[:-2], first, second)
    else:
        nvfp4kv.nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping(
            case.append_ckv, case.append_kpe, slots, *case.caches(), first, second
        )


def written_bytes(case) -> torch.Tensor:
    if isinstance(case, MlaCase):
        return case.cache_bytes()
    return torch.cat([cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf)])


def cpu_scale(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32)


SCALE_OPS = {
    "page_table": ("append_paged_kv_cache", "k_scale", "v_scale"),
    "slot_mapping": ("append_paged_kv_cache_with_slot_mapping", "k_scale", "v_scale"),
    "mla": ("append_paged_mla_kv_cache", "ckv_scale", "kpe_scale"),
    "mla_slot_mapping": ("append_paged_mla_kv_cache_with_slot_mapping", "ckv_scale", "kpe_scale"),
}


@pytest.mark.parametrize("variant", SCALE_VARIANTS)
@pytest.mark.parametrize("second", [False, True])
@pytest.mark.parametrize("bad,shown", [(0.0, "0"), (-1.0, "-1"), (float("nan"), "nan"), (float("inf"), "inf"),
                                       (1e39, "1e+39")])  # fmt: skip
def test_bad_float_scale_is_named_with_flashinfers_phrase(device, variant, second, bad, shown):
    """FlashInfer's "positive finite global decode scale", with the op, the argument and the value given."""
    case = scale_case(variant, seed=59).to(device)
    before = written_bytes(case)
    op, *names = SCALE_OPS[variant]
    scales = list(float_scales(case))
    scales[second] = bad
    message = f"nvfp4kv.{op}: {names[second]} must be a positive finite global decode scale in float32, got {shown}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        append_with_scales(variant, case, *scales)
    assert torch.equal(written_bytes(case), before)


@pytest.mark.parametrize("variant", SCALE_VARIANTS)
def test_cpu_tensor_scales_with_meta_inputs_reach_the_fake(variant):
    """Meta inputs dispatch to the fake implementation, which takes a CPU scale tensor as the op does."""
    case = scale_case(variant, seed=60).to("meta")
    append_with_scales(variant, case, *(cpu_scale(s) for s in float_scales(scale_case(variant, seed=60))))


def fake_cuda(case):
    """The case with every tensor a fake CUDA tensor of the same metadata (no GPU needed)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def convert(value):
        if isinstance(value, tuple):
            return tuple(convert(v) for v in value)
        if isinstance(value, torch.Tensor):
            return mode.fake_tensor_converter.from_meta_and_device(mode, value.to("meta"), torch.device("cuda:0"))
        return value

    return mode, type(case)(**{f.name: convert(getattr(case, f.name)) for f in dataclasses.fields(case)})


# The MLA slot-mapping case computes its slots from fake CUDA tensors, which needs a GPU; its fake runs the
# check of the MLA page-table fake.
@pytest.mark.parametrize("variant", SCALE_VARIANTS[:3])
def test_cpu_tensor_scales_with_fake_cuda_inputs_are_traced(variant):
    """What torch.compile's fake tensors see for CUDA inputs: a CPU scale tensor is accepted, a scale on another
    device is refused with the op's message."""
    mode, case = fake_cuda(scale_case(variant, seed=61))
    first, second = (cpu_scale(s) for s in float_scales(scale_case(variant, seed=61)))
    with mode:
        append_with_scales(variant, case, first, second)
        name = "ckv_scale" if variant.startswith("mla") else "k_scale"
        with pytest.raises(ValueError, match=rf"{name} as a tensor must be a one-element float32 tensor on "
                           r"append_(key|ckv)'s device \(cuda:0\) or the CPU, got .* device meta"):  # fmt: skip
            append_with_scales(variant, case, first.to("meta"), second)


@pytest.mark.skipif(not has_cuda(), reason="needs a GPU")
@pytest.mark.parametrize("variant", SCALE_VARIANTS)
def test_cpu_tensor_scales_with_cuda_inputs_give_the_float_scale_bytes(variant):
    case = scale_case(variant, seed=62).to("cuda")
    with_floats, with_tensors = case.cloned(), case.cloned()
    append_with_scales(variant, with_floats, *float_scales(case))
    append_with_scales(variant, with_tensors, *(cpu_scale(s) for s in float_scales(case)))
    assert torch.equal(written_bytes(with_tensors), written_bytes(with_floats))
    assert not torch.equal(written_bytes(with_floats), written_bytes(case))


@pytest.mark.skipif(not has_cuda(), reason="needs CUDA graph capture")
@pytest.mark.parametrize("variant", SCALE_VARIANTS)
def test_cpu_tensor_scale_is_refused_during_graph_capture(variant):
    case = scale_case(variant, seed=63).to("cuda")
    first, second = float_scales(case)
    before = written_bytes(case)
    slots, scale = variant_slots(variant, case), cpu_scale(first)  # before capture: the slots copy to the GPU
    name, rows = ("ckv_scale", "append_ckv") if variant.startswith("mla") else ("k_scale", "append_key")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=rf"{name} as a CPU tensor cannot be read during CUDA graph capture .*: "
                       rf"pass a float or a one-element float32 tensor on {rows}'s device \(cuda:0\), "
                       r"got a CPU tensor$"):  # fmt: skip
        with torch.cuda.graph(graph):
            append_with_scales(variant, case, scale, second, slots)
    assert torch.equal(written_bytes(case), before)


@pytest.mark.skipif(not has_cuda(), reason="needs a GPU")
@pytest.mark.parametrize("variant", SCALE_VARIANTS)
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("debug", [False, True])
def test_bad_cpu_tensor_scale_with_cuda_inputs_raises_the_float_error(variant, bad, debug):
    """Read on the host, a CPU scale is checked as its float is (debug checks leave it to the op)."""
    case = scale_case(variant, seed=64).to("cuda")
    before = written_bytes(case)
    second = float_scales(case)[1]
    nvfp4kv.set_debug_checks(debug)
    try:
        with pytest.raises(ValueError) as with_float:
            append_with_scales(variant, case, bad, second)
        with pytest.raises(ValueError) as with_tensor:
            append_with_scales(variant, case, cpu_scale(bad), second)
    finally:
        nvfp4kv.set_debug_checks(False)
    assert str(with_tensor.value) == str(with_float.value)
    assert "must be a positive finite global decode scale in float32, got " in str(with_tensor.value)
    assert torch.equal(written_bytes(case), before)


# ---------------------------------------------------------------- readback and calibration


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("tensor_scales", [None, "device", "cpu"])
def test_dequantize_paged_kv_cache_reads_back_every_request(device, layout, stacked, tensor_scales):
    """Append whole requests (prefill from position 0), read them back ragged, compare with the
    reference's quantize -> dequantize of the same rows; scales as floats, as tensors on the cache's device,
    or as CPU tensors (read on the host with a CUDA cache)."""
    g = torch.Generator().manual_seed(41)
    page_size, heads, head_dim = 4, 2, 32
    seq_lens = torch.tensor([5, 1, 9])
    pages = (seq_lens + page_size - 1) // page_size
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(pages, 0)])
    kv_indices = torch.randperm(int(pages.sum()) + 3, generator=g)[: int(pages.sum())]
    last = seq_lens - (pages - 1) * page_size
    total = int(seq_lens.sum())
    batch_indices = torch.repeat_interleave(torch.arange(3), seq_lens)
    positions = torch.cat([torch.arange(int(n)) for n in seq_lens])
    key = torch.randn(total, heads, head_dim, generator=g).to(torch.bfloat16)
    value = torch.randn(total, heads, head_dim, generator=g).to(torch.bfloat16)
    num_pages = int(kv_indices.max()) + 1
    inner = (page_size, heads) if layout == "NHD" else (heads, page_size)
    cache = torch.zeros(num_pages, 2, *inner, head_dim // 2, dtype=torch.uint8)
    cache_sf = torch.zeros(num_pages, 2, *inner, head_dim // 16, dtype=torch.uint8).view(torch.float8_e4m3fn)
    caches = (cache, cache_sf) if stacked else (tuple(cache.unbind(1)), tuple(cache_sf.unbind(1)))
    to = lambda t: t.to(device)  # noqa: E731
    caches = tuple(to(c) if isinstance(c, torch.Tensor) else tuple(map(to, c)) for c in caches)
    k_scale, v_scale = 0.003, 0.004
    scales = (
        (k_scale, v_scale)
        if tensor_scales is None
        else tuple(torch.tensor([s], device=device if tensor_scales == "device" else "cpu") for s in (k_scale, v_scale))
    )
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        to(key),
        to(value),
        to(batch_indices),
        to(positions),
        *caches,
        to(kv_indices),
        to(kv_indptr),
        to(last),
        *scales,
        layout,
    )
    k, v = nvfp4kv.dequantize_paged_kv_cache(
        *caches, to(kv_indices), to(kv_indptr), to(last), *scales, layout, out_dtype=torch.float32
    )
    assert k.shape == (total, heads, head_dim) and k.dtype == torch.float32 and k.device.type == device
    expected_k = reference.dequantize(*reference.quantize(key, k_scale), k_scale)
    expected_v = reference.dequantize(*reference.quantize(value, v_scale), v_scale)
    assert torch.equal(k.cpu(), expected_k) and torch.equal(v.cpu(), expected_v)
    k16, _ = nvfp4kv.dequantize_paged_kv_cache(*caches, to(kv_indices), to(kv_indptr), to(last), *scales, layout)
    assert k16.dtype == torch.bfloat16 and torch.equal(k16.cpu(), expected_k.to(torch.bfloat16))


@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e4m3fn])
@pytest.mark.parametrize("flat", [False, True])
def test_e2m1_and_ufp8sf_scale_to_float(device, scale_dtype, flat):
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(42))
    packed, scales = reference.quantize(x, 0.01)
    sf = scales.view(torch.uint8) if scale_dtype == torch.uint8 else scales
    sf = sf.flatten() if flat else sf
    out = e2m1_and_ufp8sf_scale_to_float(packed.to(device), sf.to(device), torch.tensor([0.01]), 16, 1, False)
    assert out.device.type == device and out.shape == (6, 64) and out.dtype == torch.float32
    assert torch.equal(out.cpu(), reference.dequantize(packed, scales, 0.01))


def test_e2m1_and_ufp8sf_scale_to_float_rejects_unsupported_layouts():
    packed = torch.zeros(2, 8, dtype=torch.uint8)
    sf = torch.zeros(2, 1, dtype=torch.uint8)
    with pytest.raises(NotImplementedError, match="only the linear scale layout"):
        e2m1_and_ufp8sf_scale_to_float(packed, sf, torch.tensor([1.0]))  # FlashInfer's default: swizzled
    with pytest.raises(NotImplementedError, match="sf_vec_size must be 16"):
        e2m1_and_ufp8sf_scale_to_float(packed, sf, torch.tensor([1.0]), 32, 1, False)
    with pytest.raises(NotImplementedError, match="ufp8_type must be 1"):
        e2m1_and_ufp8sf_scale_to_float(packed, sf, torch.tensor([1.0]), 16, 0, False)


def test_global_scale_from_amax_puts_the_largest_block_at_448():
    g = torch.Generator().manual_seed(43)
    x = torch.randn(64, 8, 128, generator=g) * 3
    amax = x.abs().max()
    assert nvfp4kv.global_scale_from_amax(float(amax)) == pytest.approx(float(amax) / 2688)
    scale = float(nvfp4kv.global_scale_from_amax(amax))
    _, block_scales = reference.quantize(x, scale)
    assert int(block_scales.view(torch.uint8).max()) == 0x7E  # 448: the top of E4M3, nothing saturates past it
    # Small activations: with s = 1.0 block scales fall into E4M3's subnormals and the error grows.
    small = x * 1e-3
    calibrated = float(nvfp4kv.global_scale_from_amax(small.abs().max()))
    error = lambda s: float((reference.dequantize(*reference.quantize(small, s), s) - small).norm())  # noqa: E731
    assert error(calibrated) < 0.5 * error(1.0)
