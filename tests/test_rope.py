"""The fused RoPE + NVFP4 appends (docs/SPEC.md section 5) against the pure-PyTorch reference
(python/nvfp4kv/reference_rope.py), on every device.

Every comparison is of bytes: the whole storage behind both caches (poisoned with random bytes), Q out (fresh,
preallocated over poison, in place in query, or FP8), k_out, and the whole storage behind query/key/value (in-place
Q out writes query's bytes and nothing else). On CUDA the CPU op's bytes must match too. The parameter grid is an
all-pairs cover (tests/rope_cases.py: pairwise), not a full product; random calls beyond its geometries (hypothesis,
conftest.FUZZ) check the same bytes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import (
    FUZZ,
    assert_no_synchronisation_or_allocation,
    assert_same_caches,
    has_cuda,
    misaligned_copy,
    seed_of,
)
from hypothesis import assume, given
from hypothesis import strategies as st

import nvfp4kv
from nvfp4kv import reference_rope

from append_cases import cache_bytes
from rope_cases import RopeCase, cos_sin_table, make_rope_case, pairwise

OP = "rope_append_paged_kv_cache"
REPOSITORY = Path(__file__).resolve().parent.parent
FP8 = torch.float8_e4m3fn
Q_MODES = ("new", "given", "in_place", "fp8", "fp8_given")


def _poison(shape, dtype: torch.dtype, device, seed: int) -> torch.Tensor:
    """A [n, H, D] view (head dim padded by one, so not contiguous) of random bytes as `dtype`."""
    n, heads, head_dim = shape
    item = torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, heads + 1, head_dim * item), dtype=torch.uint8, generator=g)
    return raw.view(dtype)[:, :heads].to(device)


def call(module, case: RopeCase, *, slots=False, q_mode="new", k_out=True, device_scales=False, **options):
    """One call of the op (module nvfp4kv) or of the reference (module reference_rope) on `case`; returns
    (the returned Q out, the q_out argument or None, the k_out argument or None)."""
    device = case.query.device
    scale = (lambda v: torch.tensor([v], dtype=torch.float32, device=device)) if device_scales else float
    kwargs = dict(is_neox=case.is_neox, **options)
    if q_mode == "given":
        kwargs["q_out"] = _poison(case.query.shape, case.query.dtype, device, 1)
    elif q_mode == "in_place":
        kwargs["q_out"] = case.query
    elif q_mode == "fp8":
        kwargs["q_out_dtype"] = FP8
    elif q_mode == "fp8_given":
        kwargs["q_out"] = _poison(case.query.shape, FP8, device, 2)
    if q_mode.startswith("fp8"):
        kwargs["q_scale"] = scale(case.q_scale)
    if k_out:
        kwargs["k_out"] = _poison(case.key.shape, case.key.dtype, device, 3)
    scales = (scale(case.k_scale), scale(case.v_scale))
    if slots:
        args = (*case.slot_args()[:8], *scales, case.kv_layout)
        result = module.rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(*args, **kwargs)
    else:
        args = (*case.args()[:12], *scales, case.kv_layout)
        result = module.rope_quantize_nvfp4_append_paged_kv_cache(*args, **kwargs)
    return result, kwargs.get("q_out"), kwargs.get("k_out")


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor's elements (not of its storage), on the CPU."""
    return t.contiguous().cpu().view(torch.uint8)


def assert_rope_matches(case: RopeCase, device: str, what: str = "", **kw) -> tuple:
    """Calls the op on `device` and the reference on the CPU, each on its own copy of the case, and compares
    caches, Q out, k_out and the input storage byte for byte (on CUDA the CPU op's too). Returns the device
    side's (case, call result)."""
    ours = case.to(device)
    sides = [(ours, call(nvfp4kv, ours, **kw))]
    theirs = case.cloned()
    expected = call(reference_rope, theirs, **kw)
    if device != "cpu":
        on_cpu = case.cloned()
        sides.append((on_cpu, call(nvfp4kv, on_cpu, **kw)))
        torch.cuda.synchronize()
    q_mode = kw.get("q_mode", "new")
    for (side, (q, q_out, k_out)), label in zip(sides, (device, "cpu")):
        tag = f"{what} {label} vs reference:".lstrip()
        assert_same_caches(side, theirs, tag)
        assert q.shape == case.query.shape, f"{tag} q shape {tuple(q.shape)}"
        assert q.dtype == (FP8 if q_mode.startswith("fp8") else case.query.dtype), f"{tag} q dtype {q.dtype}"
        if q_out is not None:
            assert q.data_ptr() == q_out.data_ptr() and q.stride() == q_out.stride(), f"{tag} q_out not returned"
        else:
            assert q.is_contiguous(), f"{tag} a fresh q_out must be contiguous, got strides {q.stride()}"
        got, want = raw(q), raw(expected[0])
        assert torch.equal(got, want), f"{tag} Q out: {int((got != want).sum())} of {got.numel()} bytes differ"
        if k_out is not None:
            got, want = raw(k_out), raw(expected[2])
            assert torch.equal(got, want), f"{tag} k_out: {int((got != want).sum())} of {got.numel()} bytes differ"
        got, want = cache_bytes(side.inputs()), cache_bytes(theirs.inputs())
        assert torch.equal(got, want), f"{tag} inputs: {int((got != want).sum())} bytes differ"
    return ours, sides[0][1]


# ---------------------------------------------------------------------------------------------------------------
# Byte equality with the reference over an all-pairs grid
# ---------------------------------------------------------------------------------------------------------------

GEOMETRIES = [(d, r) for d in (64, 128, 256) for r in sorted({d, d // 2, 64, 32, 20}, reverse=True) if r <= d]
GRID = pairwise(
    {
        "geometry": GEOMETRIES,  # (head_dim, rotary_dim)
        "q_mode": Q_MODES,
        "is_neox": (True, False),
        "dtype": (torch.bfloat16, torch.float16),
        "table_dtype": (torch.float32, torch.float16, torch.bfloat16),
        "heads": ((4, 2), (2, 2), (6, 1)),  # (num_qo_heads, num_kv_heads)
        "index_dtype": (torch.int32, torch.int64),
        "rope_index_dtype": (torch.int64, torch.int32),
        "layout": ("NHD", "HND"),
        "stacked": (False, True),
        "strided_cache": (False, True),
        "packed": (True, False),
        "v_sf_layout": ("linear", "trtllm"),
        "scale_search": ("none", "4over6"),
        "slots": (False, True),
        "device_scales": (False, True),
        "decode": (False, True),
        "k_out": (True, False),
        "special_values": (True, False),
    },
    seed=21,
)


def _grid_id(p: dict) -> str:
    d, r = p["geometry"]
    short = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
             torch.int64: "i64"}  # fmt: skip
    flags = [name for name in ("stacked", "strided_cache", "packed", "slots", "device_scales", "decode", "k_out",
                               "special_values") if p[name]]  # fmt: skip
    return "-".join([f"D{d}R{r}", p["q_mode"], "neox" if p["is_neox"] else "gptj", short[p["dtype"]],
                     "table_" + short[p["table_dtype"]], "H{}x{}".format(*p["heads"]), short[p["index_dtype"]],
                     "pos_" + short[p["rope_index_dtype"]], p["layout"], p["v_sf_layout"], p["scale_search"],
                     *flags])  # fmt: skip


@pytest.mark.parametrize("params", GRID, ids=[_grid_id(p) for p in GRID])
def test_matches_reference(params, device):
    _assert_grid_case_matches(params, device)


@pytest.mark.skipif(not has_cuda(), reason="needs CUDA")
@pytest.mark.parametrize("forced_kernel_mode", ["oneshot", "split", "pair"], indirect=True)
@pytest.mark.parametrize("params", GRID, ids=[_grid_id(p) for p in GRID])
def test_other_cuda_kernel_shapes_match_reference(params, forced_kernel_mode):
    """The CUDA kernels' other shapes on the same grid (the grid's calls are small: the automatic choice is a
    128-thread chunk of one row per CTA, in the rows kernel for the common shape and in the decode kernel
    otherwise): one CTA per row ("oneshot"), the decode kernel for every shape ("split"), and the prefill shape,
    chunks of 2 or 4 rows staged in shared memory ("pair"; calls whose inputs are not 16-byte aligned keep one row
    per CTA)."""
    _assert_grid_case_matches(params, "cuda")


@st.composite
def random_calls(draw) -> tuple:
    """make_rope_case's options and call's, beyond the grid: any head_dim of 16-value units up to 512, any even
    rotary_dim, any head counts, page sizes that do not divide the tokens ("trtllm" V scales: where their tiles fit)."""
    head_dim = draw(st.sampled_from([16, 32, 48, 64, 80, 128, 192, 256, 512]))
    padding_rows = draw(st.sampled_from([0, 3, 5]))
    v_sf_layout = draw(st.sampled_from(["linear", "trtllm"] if head_dim % 64 == 0 else ["linear"]))
    case_options = dict(
        num_qo_heads=draw(st.integers(1, 6)),
        num_kv_heads=draw(st.integers(1, 3)),
        head_dim=head_dim,
        rotary_dim=2 * draw(st.integers(1, head_dim // 2)),
        page_size=draw(st.sampled_from([1, 2, 3, 16] if v_sf_layout == "linear" else [4, 16])),
        batch_size=draw(st.integers(1, 4)),
        max_tokens=draw(st.integers(1, 40)),
        decode=draw(st.booleans()),
        layout=draw(st.sampled_from(["NHD", "HND"])),
        stacked=draw(st.booleans()),
        strided_cache=v_sf_layout == "linear" and draw(st.booleans()),  # "trtllm" needs contiguous tiles
        packed=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.bfloat16, torch.float16])),
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        rope_index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        table_dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
        is_neox=draw(st.booleans()),
        padding_rows=padding_rows,
        invalid_positions=draw(st.booleans()),
        special_values=padding_rows >= 3 and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    call_options = dict(
        slots=draw(st.booleans()),
        q_mode=draw(st.sampled_from(Q_MODES)),
        k_out=draw(st.booleans()),
        v_sf_layout=v_sf_layout,
        scale_search=draw(st.sampled_from(["none", "4over6"])),
    )
    return case_options, call_options


@FUZZ
@given(random_call=random_calls())
def test_random_calls_match_reference(device, random_call):
    case_options, call_options = random_call
    case = make_rope_case(**case_options)
    assume(case.k_scale > 0 and case.v_scale > 0)  # a few rows can be all zeros: no scale to calibrate
    assert_rope_matches(case, device, **call_options)


# (cache index dtype, RoPE position dtype): the kernels read one type throughout, or a mix.
INDEX_DTYPES = {
    "i32": (torch.int32, torch.int32),
    "i64": (torch.int64, torch.int64),
    "mixed": (torch.int32, torch.int64),
}


@pytest.mark.skipif(not has_cuda(), reason="needs CUDA")
@pytest.mark.parametrize("forced_kernel_mode", ["auto", "pair"], indirect=True)
@pytest.mark.parametrize("indices", INDEX_DTYPES)
@pytest.mark.parametrize("q_mode", Q_MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_common_shape_instances_match_reference(head_dim, dtype, q_mode, indices, forced_kernel_mode):
    """The common (Llama-like) calls' own CUDA instances: the decode kernel at this small size ("auto") and the rows
    kernel with several rows per CTA ("pair"): NeoX pairs over the whole head, no k_out, the plain recipe, packed
    16-byte aligned inputs; 16-bit and FP8 Q, special values, positions outside the table, both V-scale layouts,
    both index variants and the index dtypes each instance is built for."""
    index_dtype, rope_index_dtype = INDEX_DTYPES[indices]
    case = make_rope_case(head_dim=head_dim, dtype=dtype, packed=True, special_values=True, index_dtype=index_dtype,
                          rope_index_dtype=rope_index_dtype,
                          seed=seed_of("common shape", head_dim, str(dtype), q_mode, indices))  # fmt: skip
    assert_rope_matches(case, "cuda", q_mode=q_mode, slots=head_dim == 128, k_out=False,
                        v_sf_layout="trtllm" if dtype == torch.float16 else "linear")  # fmt: skip


@pytest.mark.skipif(not has_cuda(), reason="needs CUDA")
@pytest.mark.parametrize("indices", INDEX_DTYPES)
@pytest.mark.parametrize("q_mode", ["new", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decode", [False, True], ids=["prefill_table", "decode_table"])
def test_common_shape_between_the_decode_and_multi_row_sizes(decode, dtype, q_mode, indices):
    """Common calls of more rows than the CUDA decode kernel takes (64) and fewer than the rows kernel's multi-row
    instances start at (1024): its one-row instances, with requests of one token (the chain's decode guess) and of
    many."""
    index_dtype, rope_index_dtype = INDEX_DTYPES[indices]
    seed = seed_of("one-row common", decode, str(dtype), q_mode, indices)
    case = make_rope_case(head_dim=128, dtype=dtype, packed=True, special_values=True, index_dtype=index_dtype,
                          rope_index_dtype=rope_index_dtype, decode=decode, batch_size=80 if decode else 24,
                          max_tokens=40, seed=seed)  # fmt: skip
    assert 64 < case.query.shape[0] < 1024
    assert_rope_matches(case, "cuda", q_mode=q_mode, slots=not decode, k_out=False)


@pytest.mark.parametrize("q_mode", ["new", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [(7, 1, 128), (5, 2, 256), (3, 1, 512)], ids=lambda h: "Hq{}xHkv{}xD{}".format(*h))
def test_common_shape_with_an_odd_number_of_q_heads(heads, dtype, q_mode, device):
    """Common-shape decode calls with an odd number of Q heads: in the CUDA one-row instance a CTA's 128 lanes then
    hold the last Q heads and the first K (or V) heads together, and at D 512 one head fills a whole warp."""
    num_qo_heads, num_kv_heads, head_dim = heads
    case = make_rope_case(num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
                          packed=True, special_values=True, decode=True, batch_size=5,
                          seed=seed_of("odd q heads", *heads, str(dtype), q_mode))  # fmt: skip
    assert_rope_matches(case, device, q_mode=q_mode, k_out=False)


def _table_laid_out(table: torch.Tensor, layout: str) -> torch.Tensor:
    """The same cos/sin values packed, or as a view whose rows are not 16-byte aligned: rows two values apart
    ("row_stride"), or the whole table one value past an aligned start ("offset")."""
    if layout == "row_stride":
        wide = torch.zeros(table.shape[0], table.shape[1] + 2, dtype=table.dtype)
        wide[:, : table.shape[1]] = table
        return wide[:, : table.shape[1]]
    if layout == "offset":
        return misaligned_copy(table, 1)
    return table


@pytest.mark.parametrize("forced_kernel_mode", ["auto", "pair"], indirect=True)
@pytest.mark.parametrize("layout", ["packed", "row_stride", "offset"])
@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_common_shape_table_dtypes_and_layouts(table_dtype, layout, forced_kernel_mode, device):
    """A common-shape call (the CUDA rows kernel's own instances, one row per CTA and several) with a table of
    every dtype, packed or as a view whose rows are not 16-byte aligned (every other test's tables are packed)."""
    if device == "cpu" and forced_kernel_mode != "auto":
        pytest.skip("the CPU op has one kernel")
    case = make_rope_case(head_dim=128, packed=True, special_values=True, table_dtype=table_dtype,
                          seed=seed_of("table layout", str(table_dtype), layout))  # fmt: skip
    case = dataclasses.replace(case, cos_sin_cache=_table_laid_out(case.cos_sin_cache, layout))
    assert_rope_matches(case, device, q_mode="fp8" if table_dtype == torch.float16 else "new", k_out=False)


def _assert_grid_case_matches(p: dict, device: str) -> None:
    (head_dim, rotary_dim), (num_qo_heads, num_kv_heads) = p["geometry"], p["heads"]
    seed = seed_of(_grid_id(p))
    case = make_rope_case(
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        batch_size=6 if p["decode"] else 3,
        decode=p["decode"],
        layout=p["layout"],
        stacked=p["stacked"],
        strided_cache=p["strided_cache"] and p["v_sf_layout"] == "linear",  # "trtllm" needs contiguous tiles
        packed=p["packed"],
        dtype=p["dtype"],
        index_dtype=p["index_dtype"],
        rope_index_dtype=p["rope_index_dtype"],
        table_dtype=p["table_dtype"],
        is_neox=p["is_neox"],
        special_values=p["special_values"] or p["q_mode"].startswith("fp8"),
        seed=seed,
    )
    assert_rope_matches(
        case,
        device,
        f"seed {seed}",
        slots=p["slots"],
        q_mode=p["q_mode"],
        k_out=p["k_out"],
        device_scales=p["device_scales"],
        v_sf_layout=p["v_sf_layout"],
        scale_search=p["scale_search"],
    )


def test_grid_covers_every_pair_and_stays_small():
    assert len(GRID) <= 80, len(GRID)
    assert {p["geometry"] for p in GRID} == set(GEOMETRIES)
    assert {(p["geometry"], p["q_mode"]) for p in GRID} == {(g, q) for g in GEOMETRIES for q in Q_MODES}


@pytest.mark.parametrize("q_mode", Q_MODES)
def test_every_row_placed_and_no_padding(q_mode, device):
    """nnz == n, every rope position in the table: the plain shape of a prefill chunk."""
    case = make_rope_case(head_dim=128, padding_rows=0, invalid_positions=False, seed=seed_of("all rows", q_mode))
    assert_rope_matches(case, device, q_mode=q_mode)


def test_large_prefill_matches_reference(device):
    """A call of a few thousand rows with an odd count (CUDA kernels take their multi-block paths)."""
    case = make_rope_case(num_qo_heads=8, num_kv_heads=2, head_dim=128, batch_size=9, max_tokens=400,
                          page_size=64, seed=77)  # fmt: skip
    assert case.query.shape[0] >= 1000 and case.query.shape[0] % 2 == 1, case.query.shape
    assert_rope_matches(case, device, "seed 77", q_mode="given")
    assert_rope_matches(case, device, "seed 77 slots fp8", q_mode="fp8", slots=True)


# ---------------------------------------------------------------------------------------------------------------
# Rows that are not placed, and the unfused pipeline
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("slots", [False, True])
def test_positions_outside_the_table_write_nothing_and_zero_q(slots, device):
    """Every rope position is -1 or max_pos: the caches keep their poison, Q out (over poison) and k_out are zeros,
    FP8 Q out +0 bytes."""
    case = make_rope_case(seed=seed_of("invalid", slots))
    max_pos = case.cos_sin_cache.shape[0]
    case.rope_positions = torch.where(torch.arange(case.query.shape[0]) % 2 == 0, -1, max_pos).to(torch.int32)
    ours = case.to(device)
    before = cache_bytes(ours.paged_kv_cache), cache_bytes(ours.kv_cache_sf)
    for q_mode in ("given", "fp8_given", "new"):
        q, _, k_out = call(nvfp4kv, ours, slots=slots, q_mode=q_mode)
        assert raw(q).eq(0).all() and raw(k_out).eq(0).all(), q_mode
    assert torch.equal(cache_bytes(ours.paged_kv_cache), before[0])
    assert torch.equal(cache_bytes(ours.kv_cache_sf), before[1])


def test_equals_rope_then_the_unfused_append(device):
    """The cache bytes of the fused op equal those of reference RoPE on K followed by the compiled plain append."""
    case = make_rope_case(head_dim=128, rotary_dim=64, padding_rows=0, invalid_positions=False, seed=31)
    fused = case.to(device)
    q, _, _ = call(nvfp4kv, fused, q_mode="new")
    unfused = case.to(device)
    key, _ = reference_rope.apply_rope(unfused.key, unfused.cos_sin_cache, unfused.rope_positions, case.is_neox)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(key, *unfused.args()[2:3], *unfused.args()[5:])
    assert_same_caches(fused, unfused, "fused vs rope -> append:")
    expected_q, _ = reference_rope.apply_rope(unfused.query, unfused.cos_sin_cache, unfused.rope_positions,
                                              case.is_neox)  # fmt: skip
    assert torch.equal(raw(q), raw(expected_q))


def test_device_scales_equal_float_scales(device):
    """[1] float32 tensors of k_scale, v_scale and q_scale on the inputs' device give the bytes of floats."""
    case = make_rope_case(special_values=True, seed=41)
    as_floats, (q_floats, _, _) = assert_rope_matches(case, device, q_mode="fp8")
    as_tensors = case.to(device)
    q_tensors, _, _ = call(nvfp4kv, as_tensors, q_mode="fp8", device_scales=True)
    assert_same_caches(as_floats, as_tensors, "scale tensors vs floats:")
    assert torch.equal(raw(q_floats), raw(q_tensors))


# ---------------------------------------------------------------------------------------------------------------
# Errors: named before anything is written
# ---------------------------------------------------------------------------------------------------------------


def _shifted(t: torch.Tensor, elements: int) -> torch.Tensor:
    """t's view geometry moved by `elements` inside its storage."""
    return t.as_strided(t.shape, t.stride(), t.storage_offset() + elements)


def _args(c: RopeCase, **positional):
    return [positional.get(name, value) for name, value in zip(ARG_NAMES, c.args())]


ARG_NAMES = ("query", "key", "value", "cos_sin_cache", "rope_positions", "batch_indices", "positions",
             "paged_kv_cache", "kv_cache_sf", "kv_indices", "kv_indptr", "kv_last_page_len", "k_scale", "v_scale",
             "kv_layout")  # fmt: skip


def _longer_placement(c: RopeCase) -> dict:
    n, nnz = c.query.shape[0], c.batch_indices.numel()
    extra = n - nnz + 1
    return dict(batch_indices=torch.cat([c.batch_indices, c.batch_indices[:1].repeat(extra)]),
                positions=torch.cat([c.positions, c.positions[:1].repeat(extra)]))  # fmt: skip


def _empty(c: RopeCase, heads: int, head_dim: int, dtype) -> torch.Tensor:
    return torch.zeros(c.query.shape[0], heads, head_dim, dtype=dtype, device=c.query.device)


# (id, change: case -> (positional changes, keyword changes), the argument the message must name)
BAD = [
    ("table_1d", lambda c: (dict(cos_sin_cache=c.cos_sin_cache.flatten()), {}), "cos_sin_cache"),
    ("table_3d", lambda c: (dict(cos_sin_cache=c.cos_sin_cache[None]), {}), "cos_sin_cache"),
    ("table_float64", lambda c: (dict(cos_sin_cache=c.cos_sin_cache.double()), {}), "cos_sin_cache"),
    ("table_int32", lambda c: (dict(cos_sin_cache=c.cos_sin_cache.to(torch.int32)), {}), "cos_sin_cache"),
    ("rotary_dim_odd", lambda c: (dict(cos_sin_cache=c.cos_sin_cache[:, :31]), {}), "cos_sin_cache"),
    ("rotary_dim_above_head_dim", lambda c: (dict(cos_sin_cache=cos_sin_table(40, 80, torch.float32)), {}),
     "cos_sin_cache"),
    ("table_not_contiguous", lambda c: (dict(cos_sin_cache=c.cos_sin_cache.repeat(1, 2)[:, ::2]), {}),
     "cos_sin_cache"),
    ("query_float32", lambda c: (dict(query=c.query.float()), {}), "query"),
    ("query_dtype", lambda c: (dict(query=c.query.half()), {}), "query"),
    ("query_head_dim", lambda c: (dict(query=c.query[..., :48]), {}), "query"),
    ("query_rows", lambda c: (dict(query=c.query[1:]), {}), "query"),
    ("query_2d", lambda c: (dict(query=c.query[:, 0]), {}), "query"),
    ("query_not_contiguous", lambda c: (dict(query=c.query.repeat(1, 1, 2)[..., ::2]), {}), "query"),
    ("value_dtype", lambda c: (dict(value=c.value.half()), {}), "value"),
    ("value_heads", lambda c: (dict(value=c.value[:, :1]), {}), "value"),
    ("value_head_dim", lambda c: (dict(value=c.value[..., :48]), {}), "value"),
    ("rope_positions_count", lambda c: (dict(rope_positions=c.rope_positions[1:]), {}), "rope_positions"),
    ("rope_positions_float", lambda c: (dict(rope_positions=c.rope_positions.float()), {}), "rope_positions"),
    ("batch_indices_longer_than_n", lambda c: (_longer_placement(c), {}), "batch_indices"),
    ("q_scale_with_16_bit_q", lambda c: ({}, dict(q_scale=0.5)), "q_scale"),
    ("fp8_q_without_q_scale", lambda c: ({}, dict(q_out_dtype=FP8)), "q_scale"),
    ("fp8_q_out_without_q_scale", lambda c: ({}, dict(q_out=_empty(c, 4, 64, FP8))), "q_scale"),
    ("q_scale_negative", lambda c: ({}, dict(q_out_dtype=FP8, q_scale=-1.0)), "q_scale"),
    ("q_scale_nan", lambda c: ({}, dict(q_out_dtype=FP8, q_scale=float("nan"))), "q_scale"),
    ("q_out_dtype_float32", lambda c: ({}, dict(q_out_dtype=torch.float32)), "q_out_dtype"),
    ("q_out_shape", lambda c: ({}, dict(q_out=_empty(c, 4, 80, c.query.dtype))), "q_out"),
    ("q_out_heads", lambda c: ({}, dict(q_out=_empty(c, 3, 64, c.query.dtype))), "q_out"),
    ("q_out_float32", lambda c: ({}, dict(q_out=_empty(c, 4, 64, torch.float32))), "q_out"),
    ("q_out_in_place_as_fp8", lambda c: ({}, dict(q_out=c.query, q_out_dtype=FP8, q_scale=0.5)), "q_out"),
    ("q_out_overlaps_query_and_key", lambda c: ({}, dict(q_out=_shifted(c.query, 64))), "q_out"),
    ("q_out_expanded", lambda c: ({}, dict(q_out=_empty(c, 1, 64, c.query.dtype).expand(-1, 4, -1))), "q_out"),
    ("k_out_shape", lambda c: ({}, dict(k_out=_empty(c, 3, 64, c.key.dtype))), "k_out"),
    ("k_out_dtype", lambda c: ({}, dict(k_out=_empty(c, 2, 64, torch.float16))), "k_out"),
    ("k_out_overlaps_value", lambda c: ({}, dict(k_out=_shifted(c.value, -64))), "k_out"),
    ("k_out_is_key", lambda c: ({}, dict(k_out=c.key)), "k_out"),
    ("k_out_overlaps_q_out", lambda c: ({}, dict(q_out=c.query, k_out=c.query[:, :2])), "k_out"),
    ("kv_layout", lambda c: (dict(kv_layout="NDH"), {}), "kv_layout"),
    ("k_scale_negative", lambda c: (dict(k_scale=-1.0), {}), "k_scale"),
    ("v_scale_inf", lambda c: (dict(v_scale=float("inf")), {}), "v_scale"),
    ("v_sf_layout", lambda c: ({}, dict(v_sf_layout="swizzled")), "v_sf_layout"),
    ("scale_search", lambda c: ({}, dict(scale_search="exhaustive")), "scale_search"),
]  # fmt: skip


def _bad_input_case() -> RopeCase:
    """bf16, Hq 4, Hkv 2, D 64, R 32, q/k/v views of one packed qkv tensor (BAD's sizes assume these)."""
    return make_rope_case(num_qo_heads=4, num_kv_heads=2, head_dim=64, rotary_dim=32, packed=True, seed=5)


def _assert_refused(call_op, case: RopeCase, argument: str, extra_outputs=()) -> None:
    before = [cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf), cache_bytes(case.inputs())]
    before += [raw(t) for t in extra_outputs]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=rf"\b{argument}\b") as error:
        call_op()
    message = str(error.value)
    assert "got" in message, message
    after = [cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf), cache_bytes(case.inputs())]
    after += [raw(t) for t in extra_outputs]
    for name, x, y in zip(("paged_kv_cache", "kv_cache_sf", "inputs", "q_out", "k_out"), before, after):
        assert torch.equal(x, y), f"{name} changed by a refused call: {message}"


@pytest.mark.parametrize("change,argument", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_named_and_writes_nothing(change, argument, device):
    case = _bad_input_case().to(device)
    positional, keywords = change(case)
    keywords = dict(dict(is_neox=case.is_neox), **keywords)
    args = _args(case, **positional)
    outputs = [t for t in (keywords.get("q_out"), keywords.get("k_out")) if isinstance(t, torch.Tensor)]
    _assert_refused(lambda: nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*args, **keywords), case, argument,
                    outputs)  # fmt: skip


@pytest.mark.parametrize("argument", ["slot_mapping", "rope_positions", "cos_sin_cache", "q_scale"])
def test_bad_input_of_the_slot_mapping_variant_is_named(argument, device):
    case = _bad_input_case().to(device)
    n = case.query.shape[0]
    args = list(case.slot_args())
    keywords = dict(is_neox=case.is_neox)
    if argument == "slot_mapping":
        args[5] = torch.full((n + 1,), -1, dtype=case.slot_mapping.dtype, device=device)  # longer than n
    elif argument == "rope_positions":
        args[4] = case.rope_positions[:-1]
    elif argument == "cos_sin_cache":
        args[3] = case.cos_sin_cache[:, :-1]  # odd rotary_dim
    else:
        keywords["q_out_dtype"] = FP8
    _assert_refused(
        lambda: nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(*args, **keywords), case, argument
    )


def test_inputs_on_another_device_are_named():
    if not has_cuda():
        pytest.skip("needs a CUDA GPU and a build with the CUDA kernels")
    case = _bad_input_case().to("cuda")
    for name in ("query", "cos_sin_cache", "rope_positions"):
        args = _args(case, **{name: getattr(case, name).cpu()})
        _assert_refused(lambda args=args: nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*args), case, name)


# ---------------------------------------------------------------------------------------------------------------
# torch.compile, opcheck
# ---------------------------------------------------------------------------------------------------------------


def test_compiled_fullgraph_equals_eager(device):
    """A compiled function that calls the op returns Q out and mutates the caller's caches in place: the same bytes
    as eager calls, for a fresh FP8 Q out and for Q rotated in place in query."""

    def fresh_fp8(query, key, value, cos_sin, rope_positions, batch, positions, caches, scales, indices, indptr,
                  last, k_scale, v_scale, layout):  # fmt: skip
        q = nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(
            query, key, value, cos_sin, rope_positions, batch, positions, caches, scales, indices, indptr, last,
            k_scale, v_scale, layout, is_neox=False, q_out_dtype=FP8, q_scale=0.5,
        )  # fmt: skip
        return q.view(torch.uint8).float().sum(), q

    def in_place(query, key, value, cos_sin, rope_positions, batch, positions, caches, scales, indices, indptr,
                 last, k_scale, v_scale, layout):  # fmt: skip
        return nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(
            query, key, value, cos_sin, rope_positions, batch, positions, caches, scales, indices, indptr, last,
            k_scale, v_scale, layout, q_out=query,
        )  # fmt: skip

    for fn, seed in ((fresh_fp8, 51), (in_place, 52)):
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True)
        # Written tensors sharing a storage with another argument are refused under compile: a stacked cache or K
        # and V allocated separately, and Q rotated in place only when query is not a view of a packed qkv.
        case = make_rope_case(head_dim=64, rotary_dim=32, packed=seed == 51, stacked=seed == 51, special_values=True,
                              seed=seed)  # fmt: skip
        if seed == 52:
            case.paged_kv_cache = tuple(t.clone() for t in case.paged_kv_cache)
            case.kv_cache_sf = tuple(t.clone() for t in case.kv_cache_sf)
        ours, eager = case.to(device), case.to(device)
        got, want = compiled(*ours.args()), fn(*eager.args())
        got_q, want_q = (got[1], want[1]) if fn is fresh_fp8 else (got, want)
        assert torch.equal(raw(got_q), raw(want_q)), fn.__name__
        if fn is fresh_fp8:
            assert torch.equal(got[0], want[0])
        assert_same_caches(ours, eager, f"{fn.__name__} compiled vs eager:")
        assert torch.equal(cache_bytes(ours.inputs()), cache_bytes(eager.inputs())), fn.__name__


def _op_arguments(case: RopeCase, q_out: torch.Tensor, k_out: torch.Tensor) -> tuple:
    """The arguments of torch.ops.nvfp4kv.rope_append_paged_kv_cache for a tuple-cache case."""
    (k, v), (k_sf, v_sf) = case.paged_kv_cache, case.kv_cache_sf
    return (case.key, case.value, case.batch_indices, case.positions, k, v, k_sf, v_sf, case.kv_indices,
            case.kv_indptr, case.kv_last_page_len, case.k_scale, case.v_scale, case.kv_layout, None, None, "linear",
            "none", case.query, case.cos_sin_cache, case.rope_positions, q_out, k_out, case.is_neox, None,
            None)  # fmt: skip


def test_opcheck(device):
    case = make_rope_case(head_dim=64, rotary_dim=32, invalid_positions=False, seed=61).to(device)
    q_out = torch.empty_like(case.query, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(case.key, memory_format=torch.contiguous_format)
    op = torch.ops.nvfp4kv.rope_append_paged_kv_cache.default
    # test_schema compares float8 tensors with arithmetic torch lacks for float8; these are the ones that run.
    torch.library.opcheck(
        op,
        _op_arguments(case, q_out, k_out),
        test_utils=("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic"),
    )


# ---------------------------------------------------------------------------------------------------------------
# CUDA: graphs with device scales, no synchronisation or allocation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU and a build with the CUDA kernels")
@pytest.mark.parametrize("slots", [False, True])
def test_cuda_graph_replay_reads_device_scales(slots):
    """A captured decode step reads k/v/q scales, inputs and indices from device memory at each replay: the bytes
    equal the reference's with the values they hold then."""
    case = make_rope_case(num_qo_heads=8, num_kv_heads=2, head_dim=128, rotary_dim=64, batch_size=8, decode=True,
                          padding_rows=3, special_values=True, seed=71 + slots)  # fmt: skip
    static = case.to("cuda")
    scales = {name: torch.tensor([getattr(case, name)], device="cuda") for name in ("k_scale", "v_scale", "q_scale")}
    q_out = torch.empty(static.query.shape, dtype=FP8, device="cuda")
    k_out = torch.empty(static.key.shape, dtype=static.key.dtype, device="cuda")

    def step():
        kwargs = dict(is_neox=case.is_neox, q_out=q_out, q_scale=scales["q_scale"], k_out=k_out)
        if slots:
            nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
                *static.slot_args()[:8], scales["k_scale"], scales["v_scale"], static.kv_layout, **kwargs
            )
        else:
            nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(
                *static.args()[:12], scales["k_scale"], scales["v_scale"], static.kv_layout, **kwargs
            )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture, as torch recommends
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for replay in range(3):
        g = torch.Generator().manual_seed(700 + replay)
        for t in static.inputs():
            t.copy_(torch.randn(t.shape, generator=g).mul_(4).to(t.dtype))
        max_pos = static.cos_sin_cache.shape[0]
        static.rope_positions.copy_(torch.randint(-1, max_pos + 1, static.rope_positions.shape, generator=g))
        for name, factor in (("k_scale", 1.5), ("v_scale", 0.75), ("q_scale", 0.5)):
            scales[name].mul_(factor)
        expected = static.to("cpu")  # the state the replay starts from
        floats = {name: float(t) for name, t in scales.items()}
        expected = dataclasses.replace(expected, **floats)
        graph.replay()
        torch.cuda.synchronize()
        want_q, _, want_k = call(reference_rope, expected, slots=slots, q_mode="fp8")
        assert_same_caches(static, expected, f"replay {replay}:")
        assert torch.equal(raw(q_out), raw(want_q)), f"replay {replay}: Q out"
        assert torch.equal(raw(k_out), raw(want_k)), f"replay {replay}: k_out"


@pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU and a build with the CUDA kernels")
def test_no_synchronisation_and_no_allocation_when_q_out_is_given():
    case = make_rope_case(num_qo_heads=8, num_kv_heads=2, head_dim=128, batch_size=8, decode=True, seed=81)
    case = case.to("cuda")
    q_out = torch.empty(case.query.shape, dtype=case.query.dtype, device="cuda")
    q_fp8 = torch.empty(case.query.shape, dtype=FP8, device="cuda")
    k_out = torch.empty(case.key.shape, dtype=case.key.dtype, device="cuda")
    scales = [torch.tensor([v], device="cuda") for v in (case.k_scale, case.v_scale, case.q_scale)]

    def calls():
        nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*case.args(), q_out=q_out, k_out=k_out)
        nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*case.args(), q_out=case.query)
        nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*case.args()[:12], scales[0], scales[1], case.kv_layout,
                                                          q_out=q_fp8, q_scale=scales[2])  # fmt: skip
        nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
            *case.slot_args(), is_neox=False, q_out=q_fp8, q_scale=case.q_scale, k_out=k_out
        )

    assert_no_synchronisation_or_allocation(calls)


def test_torchscript_equals_eager(device):
    @torch.jit.script
    def scripted(key, value, batch, positions, k_cache, v_cache, k_sf, v_sf, indices, indptr, last,
                 k_scale: float, v_scale: float, query, table, rope_positions, q_out):  # fmt: skip
        torch.ops.nvfp4kv.rope_append_paged_kv_cache(
            key, value, batch, positions, k_cache, v_cache, k_sf, v_sf, indices, indptr, last, k_scale, v_scale,
            "NHD", None, None, "linear", "none", query, table, rope_positions, q_out, None, True, None, None,
        )  # fmt: skip

    case = make_rope_case(seed=seed_of("torchscript")).to(device)
    ours, expected = case.cloned(), case.cloned()
    (k_cache, v_cache), (k_sf, v_sf) = ours.paged_kv_cache, ours.kv_cache_sf
    q_out = torch.empty_like(ours.query)
    scripted(ours.key, ours.value, ours.batch_indices, ours.positions, k_cache, v_cache, k_sf, v_sf, ours.kv_indices,
             ours.kv_indptr, ours.kv_last_page_len, ours.k_scale, ours.v_scale, ours.query, ours.cos_sin_cache,
             ours.rope_positions, q_out)  # fmt: skip
    q_expected = reference_rope.rope_quantize_nvfp4_append_paged_kv_cache(*expected.args(), is_neox=True)
    assert torch.equal(cache_bytes(ours.paged_kv_cache), cache_bytes(expected.paged_kv_cache))
    assert torch.equal(cache_bytes(ours.kv_cache_sf), cache_bytes(expected.kv_cache_sf))
    assert torch.equal(q_out.view(torch.int16), q_expected.view(torch.int16))


def test_debug_mode_names_a_bad_row(device):
    case = make_rope_case(seed=seed_of("debug")).to(device)
    case.positions = case.positions.clone()
    case.positions[1] = -3
    nvfp4kv.set_debug_checks(True)
    try:
        with pytest.raises(ValueError, match=r"\(debug check\): row 1: position -3 is negative"):
            nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*case.args())
    finally:
        nvfp4kv.set_debug_checks(False)


@pytest.mark.skipif(not has_cuda(), reason="the README's example runs on CUDA")
def test_readme_example_compiles_captures_and_matches_reference():
    """The README's Llama-3-8B decode step (compiled, captured, replayed) writes the reference's bytes."""
    readme = (REPOSITORY / "README.md").read_text()
    start = readme.index("import torch, nvfp4kv\nfrom nvfp4kv.bench.cases import llama3_cos_sin_cache")
    example = readme[start : readme.index("```", start)]
    scope: dict = {}
    exec(compile(example, "README.md", "exec"), scope)
    torch.cuda.synchronize()
    q, qkv, seq, hq, hkv = (scope[name] for name in ("q", "qkv", "seq", "hq", "hkv"))
    caches = (torch.zeros_like(scope["k_cache"]).cpu(), torch.zeros_like(scope["v_cache"]).cpu())
    sfs = (torch.zeros_like(scope["k_sf"]).cpu(), torch.zeros_like(scope["v_sf"]).cpu())
    expected_q = reference_rope.rope_quantize_nvfp4_append_paged_kv_cache(
        qkv[:, :hq].cpu(), qkv[:, hq : hq + hkv].cpu(), qkv[:, hq + hkv :].cpu(), scope["cos_sin"].cpu(),
        (seq - 1).cpu(), scope["rows"].cpu(), (seq - 1).cpu(), caches, sfs, scope["indices"].cpu(),
        scope["indptr"].cpu(), scope["last"].cpu(), float(scope["scales"][0]), float(scope["scales"][1]),
    )  # fmt: skip
    assert torch.equal(q.cpu().view(torch.int16), expected_q.view(torch.int16))
    written = (scope["k_cache"], scope["v_cache"], scope["k_sf"], scope["v_sf"])
    for ours, theirs in zip(written, (*caches, *sfs)):
        assert torch.equal(ours.cpu().view(torch.uint8), theirs.view(torch.uint8))
    assert bool(caches[0].any())


@pytest.mark.parametrize("forced_kernel_mode", ["auto", "oneshot", "pair"], indirect=True)
@pytest.mark.parametrize("k_out", [False, True])
def test_empty_table_rotates_no_row(k_out, forced_kernel_mode, device):
    """A cos/sin table of no rows: every rope position lies outside it, so every Q (and k_out) row is zeros and
    nothing is cached; no kernel reads the empty table."""
    if device == "cpu" and forced_kernel_mode != "auto":
        pytest.skip("the CPU op has one kernel")
    case = make_rope_case(head_dim=128, packed=True, seed=seed_of("empty table", k_out))
    case = dataclasses.replace(case, cos_sin_cache=case.cos_sin_cache[:0])
    _, (q, _, written_k) = assert_rope_matches(case, device, k_out=k_out)
    assert not raw(q).any()
    assert written_k is None or not raw(written_k).any()


def test_empty_page_table_still_rotates_every_row(device):
    """No row placed (nnz 0, an empty page table): Q and k_out are rotated all the same, the caches untouched."""
    case = make_rope_case(seed=seed_of("empty page table")).to(device)
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    case.batch_indices, case.positions, case.kv_indices = empty, empty, empty
    case.kv_indptr, case.kv_last_page_len = torch.zeros(1, dtype=torch.int32, device=device), empty
    before = (cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf))
    k_out = torch.empty_like(case.key)
    q = nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*case.args(), is_neox=case.is_neox, k_out=k_out)
    q_expected, valid = reference_rope.apply_rope(case.query.cpu(), case.cos_sin_cache.cpu(),
                                                  case.rope_positions.cpu(), case.is_neox)  # fmt: skip
    k_expected, _ = reference_rope.apply_rope(case.key.cpu(), case.cos_sin_cache.cpu(), case.rope_positions.cpu(),
                                              case.is_neox)  # fmt: skip
    assert bool(valid.any())
    assert torch.equal(q.cpu().view(torch.int16), q_expected.view(torch.int16))
    assert torch.equal(k_out.cpu().view(torch.int16), k_expected.view(torch.int16))
    assert torch.equal(cache_bytes(case.paged_kv_cache), before[0])
    assert torch.equal(cache_bytes(case.kv_cache_sf), before[1])


def test_compiled_op_writes_caches_and_q_out_in_place():
    """Inductor calls the op once on the graph inputs: no clone, copy or fresh buffer stands in for a cache or for
    a given q_out."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    case, eager = (make_rope_case(stacked=True, seed=seed_of("in place")) for _ in range(2))
    q_out, eager_q_out = torch.empty_like(case.query), torch.empty_like(eager.query)

    def write(*args):
        return nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*args, q_out=q_out)

    _, codes = run_and_get_code(torch.compile(write, fullgraph=True), *case.args())
    nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*eager.args(), q_out=eager_q_out)
    assert_same_caches(case, eager, "compiled vs eager:")
    assert torch.equal(q_out.view(torch.int16), eager_q_out.view(torch.int16))
    code = "\n".join(codes)
    assert sum("torch.ops.nvfp4kv.rope_append_paged_kv_cache" in line for line in code.splitlines()) == 1, code
    assert "copy_" not in code and "clone" not in code, code


@pytest.mark.parametrize("indices", INDEX_DTYPES)
@pytest.mark.parametrize("slots", [False, True], ids=["page_table", "slots"])
def test_bad_index_data_skips_those_rows(slots, indices, device):
    """Index values are device data: rows whose batch index, position, page slot, page id or flat slot fall outside
    the page table or the cache are skipped (SPEC section 3) and still rotated into Q out; the rest are cached."""
    index_dtype, rope_index_dtype = INDEX_DTYPES[indices]
    case = make_rope_case(batch_size=4, index_dtype=index_dtype, rope_index_dtype=rope_index_dtype,
                          seed=seed_of(f"bad index data {slots}", indices))  # fmt: skip
    k_cache = case.paged_kv_cache[0] if isinstance(case.paged_kv_cache, tuple) else case.paged_kv_cache
    pages = k_cache.shape[0]
    case.batch_indices, case.positions = case.batch_indices.clone(), case.positions.clone()
    case.kv_indices, case.slot_mapping = case.kv_indices.clone(), case.slot_mapping.clone()
    case.batch_indices[0] = case.kv_last_page_len.numel() + 3  # past the batch
    case.positions[1] = -5
    case.positions[2] = 1 << 40 if case.positions.dtype == torch.int64 else (1 << 31) - 1  # past the request's pages
    case.kv_indices[-1] = pages + 7  # a page id past the cache (the last request's last page)
    case.slot_mapping[0] = pages * 10_000  # past the cache
    case.slot_mapping[2] = -(1 << 20)  # negative: padding
    assert_rope_matches(case, device, "bad index data", slots=slots)


@pytest.mark.parametrize("tensor_scales", [False, True], ids=["float_scales", "tensor_scales"])
@pytest.mark.parametrize("argument", ["key", "cos_sin_cache", "kv_layout", "v_sf_layout", "q_out"])
def test_wrong_python_types_are_named(argument, tensor_scales):
    """A wrong Python type is a TypeError naming the argument, on the decode fast path (float scales) and off it."""
    case = make_rope_case(seed=seed_of(f"python types {argument} {tensor_scales}"))
    args = list(case.args())
    kwargs = {"v_sf_layout": 3} if argument == "v_sf_layout" else {"q_out": "q"} if argument == "q_out" else {}
    if argument in ("key", "cos_sin_cache"):
        args[{"key": 1, "cos_sin_cache": 3}[argument]] = [1.0]
    if argument == "kv_layout":
        args[14] = b"NHD"
    if tensor_scales:
        args[12], args[13] = (torch.tensor([float(s)]) for s in args[12:14])
    before = cache_bytes(case.paged_kv_cache)
    with pytest.raises(TypeError, match=rf"nvfp4kv\.{OP}: {argument} must be"):
        nvfp4kv.rope_quantize_nvfp4_append_paged_kv_cache(*args, **kwargs)
    assert torch.equal(cache_bytes(case.paged_kv_cache), before)
