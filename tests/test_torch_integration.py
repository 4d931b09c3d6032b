"""The ops inside PyTorch's machinery: opcheck, torch.compile (tuple and stacked caches, no cache
copies in the generated code), TorchScript, eager calls that hold no host memory."""

import os
import sys
from typing import Optional

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import nvfp4kv

from append_cases import cache_bytes, make_append_case

# opcheck's test_schema compares tensors with allclose, which torch does not implement for float8
# (the scale caches); test_mutation_annotations_are_exact checks that contract directly.
SAFE_FOR_FLOAT8 = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def separate_tuple(case):
    """Tuple caches backed by two separate allocations."""
    return case.with_caches(tuple(t.clone() for t in case.paged_kv_cache), tuple(t.clone() for t in case.kv_cache_sf))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("stacked", [False, True])
def test_opcheck_append(stacked, layout):
    case = make_append_case(stacked=stacked, layout=layout, head_dim=32, num_heads=2, page_size=4, seed=12)
    if not stacked:
        case = separate_tuple(case)
    torch.library.opcheck(torch.ops.nvfp4kv.append_paged_kv_cache.default, case.op_args(), test_utils=SAFE_FOR_FLOAT8)


def test_mutation_annotations_are_exact():
    """Exactly the four cache arguments are marked written, and only they change at run time."""
    schema = torch.ops.nvfp4kv.append_paged_kv_cache.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["k_cache", "v_cache", "k_cache_sf", "v_cache_sf"]
    assert not schema.returns
    case = separate_tuple(make_append_case(seed=16))
    args = case.op_args()
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    torch.ops.nvfp4kv.append_paged_kv_cache(*args)
    for argument, old, new in zip(schema.arguments, before, args):
        if isinstance(new, torch.Tensor):
            changed = not torch.equal(
                old.view(torch.uint8) if old.element_size() == 1 else old,
                new.view(torch.uint8) if new.element_size() == 1 else new,
            )
            assert changed == (argument.name in written), argument.name


def test_opcheck_dequantize():
    packed = torch.randint(0, 256, (2, 3, 32), dtype=torch.uint8)
    scales = torch.randint(0, 127, (2, 3, 4), dtype=torch.uint8).view(torch.float8_e4m3fn)
    torch.library.opcheck(torch.ops.nvfp4kv.dequantize.default, (packed, scales, 0.25), test_utils=SAFE_FOR_FLOAT8)


def decode_step(key, value, batch_indices, positions, cache, cache_sf, kv_indices, kv_indptr, kv_last_page_len):
    """What a model's attention layer does: some math on K/V, then the append."""
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        key * 2.0,
        value,
        batch_indices,
        positions,
        cache,
        cache_sf,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        0.01,
        0.02,
        "NHD",
    )


@pytest.mark.parametrize("caches", ["separate_tuple", "stacked"])  # shared storage: test_compile_modes.py
def test_compile_fullgraph_matches_eager_without_cache_copies(caches):
    torch._dynamo.reset()
    case = make_append_case(stacked=caches == "stacked", seed=13, head_dim=64)
    if caches == "separate_tuple":
        case = separate_tuple(case)
    eager = case.cloned()
    decode_step(
        eager.append_key,
        eager.append_value,
        eager.batch_indices,
        eager.positions,
        eager.paged_kv_cache,
        eager.kv_cache_sf,
        eager.kv_indices,
        eager.kv_indptr,
        eager.kv_last_page_len,
    )

    compiled = torch.compile(decode_step, fullgraph=True)
    _, codes = run_and_get_code(
        compiled,
        case.append_key,
        case.append_value,
        case.batch_indices,
        case.positions,
        case.paged_kv_cache,
        case.kv_cache_sf,
        case.kv_indices,
        case.kv_indptr,
        case.kv_last_page_len,
    )
    assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(eager.paged_kv_cache))
    assert torch.equal(cache_bytes(case.kv_cache_sf), cache_bytes(eager.kv_cache_sf))

    code = "\n".join(codes)
    calls = [line for line in code.splitlines() if "torch.ops.nvfp4kv.append_paged_kv_cache" in line]
    assert len(calls) == 1, code
    # The op writes the graph inputs in place: no clone, copy or fresh buffer stands in for a cache.
    assert "copy_" not in code and "clone" not in code, code
    cache_shape = tuple(case.kv_cache_sf.shape if caches == "stacked" else case.kv_cache_sf[0].shape)
    assert f"empty_strided_cpu({cache_shape}" not in code.replace(" ", "").replace(",", ", "), code


def test_compile_dynamic_nnz_reuses_the_graph():
    torch._dynamo.reset()
    compiled = torch.compile(decode_step, fullgraph=True, dynamic=True)
    for seed, batch in ((1, 3), (2, 5)):
        case = make_append_case(stacked=True, batch_size=batch, decode=True, seed=seed, head_dim=64)
        eager = case.cloned()
        decode_step(
            eager.append_key,
            eager.append_value,
            eager.batch_indices,
            eager.positions,
            eager.paged_kv_cache,
            eager.kv_cache_sf,
            eager.kv_indices,
            eager.kv_indptr,
            eager.kv_last_page_len,
        )
        compiled(
            case.append_key,
            case.append_value,
            case.batch_indices,
            case.positions,
            case.paged_kv_cache,
            case.kv_cache_sf,
            case.kv_indices,
            case.kv_indptr,
            case.kv_last_page_len,
        )
        assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(eager.paged_kv_cache)), f"seed {seed}"


@torch.jit.script
def scripted_append(
    key: torch.Tensor,
    value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: Optional[torch.Tensor],
    k_sf: torch.Tensor,
    v_sf: Optional[torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    k_scale: float,
    v_scale: float,
    kv_layout: str,
):
    torch.ops.nvfp4kv.append_paged_kv_cache(
        key,
        value,
        batch_indices,
        positions,
        k_cache,
        v_cache,
        k_sf,
        v_sf,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        k_scale,
        v_scale,
        kv_layout,
    )
    return torch.ops.nvfp4kv.dequantize(k_cache, k_sf, k_scale) if v_cache is not None else key.float()


@pytest.mark.parametrize("stacked", [False, True])
def test_torchscript(stacked):
    case = make_append_case(stacked=stacked, layout="HND", seed=14)
    eager = case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*eager.args())
    scripted_append(*case.op_args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(eager.paged_kv_cache))
    assert torch.equal(cache_bytes(case.kv_cache_sf), cache_bytes(eager.kv_cache_sf))


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc")
def test_eager_calls_hold_no_host_memory():
    """torch 2.13's TORCH_BOX leaks a heap std::string per `str` argument on every call (pytorch/pytorch#191340):
    144 bytes per append. The kernels read their boxed arguments themselves (cpp/src/boxed_arguments.h)."""
    case = make_append_case(seed=17)
    rows = (case.append_key[:0], case.append_value[:0])  # nothing to quantize: the calls are all host path
    slots = torch.zeros(0, dtype=torch.int64)

    def calls(n):
        for _ in range(n):
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
                *rows, case.batch_indices[:0], case.positions[:0], *case.args()[4:]
            )
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                *rows, slots, case.paged_kv_cache, case.kv_cache_sf, 1.0, 1.0
            )

    calls(1000)
    before = resident_bytes()
    calls(50000)
    assert resident_bytes() - before < 2 << 20  # a leak of 144 bytes per call would be 14 MiB


def test_calls_give_back_every_tensor_reference(device):
    """The kernels own their tensor arguments' handles and release them together, taking the GIL once
    (cpp/src/gil_for_tensor_release.h): every argument's Python reference count is back where it was,
    with float and tensor scales, both variants, an exception thrown by the checks included."""
    case = make_append_case(seed=21).to(device)
    k_scale = torch.tensor([0.5], device=device)
    slots = torch.arange(case.append_key.shape[0], device=device)
    tensors = [
        case.append_key,
        case.append_value,
        case.batch_indices,
        case.positions,
        *case.paged_kv_cache,
        *case.kv_cache_sf,
        case.kv_indices,
        case.kv_indptr,
        case.kv_last_page_len,
        k_scale,
        slots,
    ]
    before = [sys.getrefcount(t) for t in tensors]
    for _ in range(20):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args()[:9], k_scale, 1.0, case.kv_layout)
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
            case.append_key, case.append_value, slots, case.paged_kv_cache, case.kv_cache_sf, k_scale, k_scale
        )
        with pytest.raises(ValueError, match="kv_layout"):
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args()[:11], "XYZ")
    if device == "cuda":
        torch.cuda.synchronize()
    assert [sys.getrefcount(t) for t in tensors] == before


@torch.jit.script
def forked_append(
    key: torch.Tensor,
    value: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: Optional[torch.Tensor],
    k_sf: torch.Tensor,
    v_sf: Optional[torch.Tensor],
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    k_scale: float,
    v_scale: float,
    kv_layout: str,
):
    future = torch.jit.fork(
        torch.ops.nvfp4kv.append_paged_kv_cache,
        key,
        value,
        batch_indices,
        positions,
        k_cache,
        v_cache,
        k_sf,
        v_sf,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        k_scale,
        v_scale,
        kv_layout,
    )
    torch.jit.wait(future)


def test_torchscript_fork_calls_from_a_thread_python_never_saw():
    """torch.jit.fork runs the op on torch's inter-op pool, a C++ thread without a Python thread state,
    with tensors that Python holds: their release takes the GIL the way torch does it (no deadlock)."""
    case = make_append_case(layout="HND", seed=22)
    eager = case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*eager.args())
    for _ in range(5):
        forked_append(*case.op_args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(eager.paged_kv_cache))
    assert torch.equal(cache_bytes(case.kv_cache_sf), cache_bytes(eager.kv_cache_sf))


def test_page_module_is_the_same_api():
    from nvfp4kv.page import nvfp4_quantize_append_paged_kv_cache

    assert nvfp4_quantize_append_paged_kv_cache is nvfp4kv.nvfp4_quantize_append_paged_kv_cache


def test_get_seq_lens():
    kv_indptr = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)  # a request with no pages gets clamp(-1) = 0
    kv_last_page_len = torch.tensor([3, 0, 16, 1], dtype=torch.int32)
    assert nvfp4kv.get_seq_lens(kv_indptr, kv_last_page_len, 16).tolist() == [19, 0, 48, 1]


def test_get_batch_indices_positions():
    append_indptr = torch.tensor([0, 3, 3, 4, 6], dtype=torch.int32)
    seq_lens = torch.tensor([10, 7, 1, 2], dtype=torch.int32)
    batch_indices, positions = nvfp4kv.get_batch_indices_positions(append_indptr, seq_lens, 6)
    assert batch_indices.dtype == torch.int32 and positions.dtype == torch.int32
    assert batch_indices.tolist() == [0, 0, 0, 2, 3, 3]
    assert positions.tolist() == [7, 8, 9, 0, 0, 1]


def test_helpers_drive_the_op_like_flashinfer():
    """seq_lens -> (batch_indices, positions) -> append lands the rows at the requests' last tokens."""
    case = make_append_case(seed=15, page_size=8)
    seq_lens = nvfp4kv.get_seq_lens(case.kv_indptr, case.kv_last_page_len, 8)
    counts = torch.bincount(case.batch_indices.long(), minlength=seq_lens.numel())
    append_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    batch_indices, positions = nvfp4kv.get_batch_indices_positions(append_indptr, seq_lens, case.append_key.shape[0])
    assert torch.equal(batch_indices.long(), case.batch_indices.long())
    assert torch.equal(positions.long(), case.positions.long())
