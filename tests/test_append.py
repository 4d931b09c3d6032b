"""Byte equality of the append op with the reference (python/nvfp4kv/reference.py) on every device
present, and on CUDA with the CPU op too, on random cases with poisoned caches.

Caches start as random bytes; the op and the reference each run on their own copy; the WHOLE storage
behind each cache must match afterwards (conftest.assert_same_caches), so a byte written in the wrong
place, or not written, fails. The same AppendCase runs on every device, moved with AppendCase.to (same
bytes, same view geometry). test_only_target_bytes_change proves the written set is exactly the target
rows. Large cases are sized for the CUDA kernels that only calls of > 2^16 blocks take.

NVFP4KV_TEST_SMALL=1 trims the parameter grids (for compute-sanitizer runs, tests/gpu/run_device.sh).
"""

import dataclasses
import os

import pytest
import torch
from conftest import assert_append_matches, assert_same_caches, misaligned_copy, page_geometry, seed_of

import nvfp4kv
from nvfp4kv import reference

from append_cases import make_append_case

SMALL = os.environ.get("NVFP4KV_TEST_SMALL") == "1"


def grid(full, small):
    return small if SMALL else full


HEAD_DIMS = [16, 48, 64, 80, 128, 192, 256, 512]
PAGE_SIZES = [1, 5, 16, 64]


@pytest.mark.parametrize("head_dim", grid(HEAD_DIMS, [16, 48, 128]))
@pytest.mark.parametrize("page_size", grid(PAGE_SIZES, [1, 16]))
def test_head_dims_and_page_sizes(device, head_dim, page_size):
    seed = HEAD_DIMS.index(head_dim) * 10 + PAGE_SIZES.index(page_size)
    case = make_append_case(
        head_dim=head_dim,
        page_size=page_size,
        num_heads=2,
        seed=seed,
        max_tokens=3 * page_size + 2,
        layout="NHD" if seed % 2 else "HND",
    )
    assert_append_matches(case, device)


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_layouts_caches_dtypes_indices(device, layout, stacked, dtype, index_dtype, decode):
    if SMALL and (stacked or index_dtype == torch.int64):
        pytest.skip("small grid")
    case = make_append_case(
        layout=layout,
        stacked=stacked,
        dtype=dtype,
        index_dtype=index_dtype,
        head_dim=128,
        num_heads=4,
        page_size=16,
        batch_size=6,
        decode=decode,
        seed=seed_of(layout, stacked, dtype, index_dtype, decode),
    )
    assert_append_matches(case, device)


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_strided_inputs_and_cache_views(device, layout, stacked):
    case = make_append_case(
        layout=layout, stacked=stacked, strided_input=True, strided_cache=True, head_dim=64, page_size=5, seed=7
    )
    assert not case.append_key.is_contiguous()
    assert_append_matches(case, device)


def test_tuple_of_stacked_halves(device):
    """Tuple caches that are the two halves of one stacked tensor, as engines often hold them."""
    case = make_append_case(stacked=True, seed=11)
    assert_append_matches(case.with_caches(case.paged_kv_cache.unbind(1), case.kv_cache_sf.unbind(1)), device)


def test_mixed_index_dtypes(device):
    """int64 positions and kv_indices beside int32 batch indices, kv_indptr and kv_last_page_len."""
    case = make_append_case(decode=True, batch_size=5, seed=31)
    mixed = dataclasses.replace(case, positions=case.positions.long(), kv_indices=case.kv_indices.long())
    assert_append_matches(mixed, device)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_step(device, layout):
    case = make_append_case(decode=True, batch_size=9, layout=layout, seed=3)
    assert case.append_key.shape[0] == 9
    assert_append_matches(case, device)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_with_shuffled_requests(device, layout):
    """nnz == batch_size but batch_indices[i] != i: the CUDA kernel's early kv_indptr load misses."""
    case = make_append_case(decode=True, batch_size=12, layout=layout, seed=19)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    shuffled = dataclasses.replace(
        case,
        append_key=case.append_key[perm],
        append_value=case.append_value[perm],
        batch_indices=case.batch_indices[perm],
        positions=case.positions[perm],
    )
    assert_append_matches(shuffled, device)


def test_large_prefill_uses_threads(device):
    case = make_append_case(head_dim=128, num_heads=8, page_size=16, batch_size=4, max_tokens=600, seed=5)
    assert_append_matches(case, device)


@pytest.mark.parametrize(
    "head_dim,num_heads,batch_size,max_tokens,dtype",
    grid(
        [
            (128, 8, 8, 1000, torch.bfloat16),  # > 2^16 blocks: the 2-blocks-per-thread prefill kernel
            (48, 8, 24, 800, torch.float16),  # odd blocks per row: 1 block per thread
            (256, 2, 12, 1000, torch.bfloat16),
            (128, 8, 16, 2000, torch.bfloat16),  # > 2^19 blocks
            (128, 2, 16, 1000, torch.float16),
        ],  # 8 threads per row: the kernel without the shared index chain
        [(128, 8, 8, 1000, torch.bfloat16)],
    ),
)
def test_large_prefill_kernels(device, head_dim, num_heads, batch_size, max_tokens, dtype):
    case = make_append_case(
        head_dim=head_dim,
        num_heads=num_heads,
        page_size=16,
        batch_size=batch_size,
        max_tokens=max_tokens,
        dtype=dtype,
        seed=head_dim + batch_size,
    )
    blocks = case.append_key.shape[0] * num_heads * head_dim // 16
    assert blocks > 1 << 16
    assert_append_matches(case, device, reference_on_cuda=not SMALL and blocks < 1 << 19)


def test_misaligned_inputs_and_caches(device):
    """Inputs only 2-byte aligned and caches at odd byte offsets: the CUDA scalar-access kernel."""
    case = make_append_case(head_dim=64, num_heads=2, page_size=4, seed=23)
    moved = dataclasses.replace(
        case,
        append_key=misaligned_copy(case.append_key, 1),
        append_value=misaligned_copy(case.append_value, 3),
        paged_kv_cache=tuple(misaligned_copy(c, 1) for c in case.paged_kv_cache),
        kv_cache_sf=tuple(misaligned_copy(c, 3) for c in case.kv_cache_sf),
    )
    assert_append_matches(moved, device)


SPECIAL_VALUES = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-7, -6e-8, 6e4, -6e4]


def test_special_values_and_extreme_scales(device):
    """NaN, +-inf, zeros, subnormals and huge values, with global scales far from the data."""
    for i, scale in enumerate([1e-30, 1e-6, None, 1e3, 3e30]):
        seed = 40 + i
        case = make_append_case(
            head_dim=64,
            num_heads=4,
            batch_size=4,
            max_tokens=20,
            seed=seed,
            dtype=torch.float16 if i % 2 else torch.bfloat16,
            global_scale=scale,
        )
        key = case.append_key.view(-1)
        g = torch.Generator().manual_seed(i)
        idx = torch.randperm(key.numel(), generator=g)
        key[idx[: len(SPECIAL_VALUES)]] = torch.tensor(SPECIAL_VALUES).to(key.dtype)
        case.append_value.view(-1)[idx[:200]] = (torch.rand(200, generator=g) * 1e-3).to(key.dtype)
        assert_append_matches(case, device, f"seed {seed}, global scale {scale}:")


@pytest.mark.parametrize("scale", [1e-30, None, 3e30, 2.0**121])
def test_four_over_six_pair_kernel_with_extreme_scales(device, scale):
    """The CUDA 4-over-6 pair kernel (a call of > 2^16 blocks per tensor) with special values in the rows
    and global scales where its error estimates do not apply (s < 2^-60, s > 2^60: the exact sums for
    every block) or where it hands the blocks to the codec (s >= 2^120)."""
    case = make_append_case(head_dim=128, num_heads=8, batch_size=8, max_tokens=400, seed=70, global_scale=scale)
    assert case.append_key.shape[0] * 8 * 128 // 16 > 1 << 16
    g = torch.Generator().manual_seed(71)
    key = case.append_key.view(-1)
    idx = torch.randperm(key.numel(), generator=g)
    key[idx[: len(SPECIAL_VALUES)]] = torch.tensor(SPECIAL_VALUES).to(key.dtype)
    case.append_value[::7] = 0.0  # all-zero blocks among the rest
    assert_append_matches(case, device, reference_on_cuda=not SMALL, scale_search="4over6")


def test_out_of_range_rows_are_skipped(device):
    """Index data never causes an out-of-bounds write: bad rows are skipped, good rows still land."""
    case = make_append_case(batch_size=3, page_size=4, max_tokens=12, seed=9, index_dtype=torch.int64)
    assert case.append_key.shape[0] >= 4
    batch_indices, positions, kv_indices = case.batch_indices.clone(), case.positions.clone(), case.kv_indices.clone()
    batch_indices[0] = 3  # batch index out of range
    positions[1] = -1  # negative position
    positions[2] = 10**6  # page slot beyond the request's pages
    kv_indices[int(case.kv_indptr[int(batch_indices[3])]) + int(positions[3]) // 4] = 10**9  # bad page
    bad = dataclasses.replace(case, batch_indices=batch_indices, positions=positions, kv_indices=kv_indices)
    assert_append_matches(bad, device)


@pytest.mark.parametrize("kind", ["batch", "position", "indptr", "page"])
def test_out_of_range_indices_are_skipped(device, kind):
    """Index data that points outside the cache is skipped, every kind of index in many rows at once."""
    case = make_append_case(batch_size=6, max_tokens=30, page_size=4, seed=50, index_dtype=torch.int64)
    bad = {f: getattr(case, f).clone() for f in ("batch_indices", "positions", "kv_indptr", "kv_indices")}
    if kind == "batch":
        rows = bad["batch_indices"][::3]
        rows.copy_(torch.tensor([-1, 6, 2**40, -(2**62)])[torch.arange(rows.numel()) % 4])
    elif kind == "position":
        rows = bad["positions"][::2]
        rows.copy_(torch.tensor([-5, 2**31, 2**31 + 7, 10**6, 2**62])[torch.arange(rows.numel()) % 5])
    elif kind == "indptr":
        bad["kv_indptr"][2] = bad["kv_indptr"][3] + 1  # a decreasing range skips its request
        bad["kv_indptr"][4] = -(2**40)
    else:
        pages = bad["kv_indices"][::2]
        pages.copy_(torch.tensor([-1, 10**9])[torch.arange(pages.numel()) % 2])
    assert_append_matches(dataclasses.replace(case, **bad), device)


def _append_with_scale_tensors(case, k_scale: float, v_scale: float):
    device = case.append_key.device
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        *case.args()[:9], torch.tensor([k_scale], device=device), torch.tensor([v_scale], device=device), case.kv_layout
    )


def test_device_scale_tensors(device):
    """[1] float32 scale tensors read on the device give the bytes of the float scales; a bad one
    (0, NaN, inf, negative) leaves its tensor's rows untouched and the other's written as usual."""
    case = make_append_case(decode=True, batch_size=7, seed=61)
    as_floats = assert_append_matches(case, device)
    as_tensors = case.to(device)
    _append_with_scale_tensors(as_tensors, case.k_scale, case.v_scale)
    assert_same_caches(as_floats, as_tensors, "scale tensors vs float scales:")
    raw = lambda t: t.view(torch.uint8).cpu()  # noqa: E731
    for bad in (0.0, float("nan"), float("inf"), -1.0):
        trial = case.to(device)
        _append_with_scale_tensors(trial, bad, case.v_scale)
        if device != "cpu":
            on_cpu = case.cloned()
            _append_with_scale_tensors(on_cpu, bad, case.v_scale)
            torch.cuda.synchronize()
            assert_same_caches(trial, on_cpu, f"bad k_scale {bad}: {device} vs CPU:")
        for name in ("paged_kv_cache", "kv_cache_sf"):
            got = getattr(trial, name)
            assert torch.equal(raw(got[0]), raw(getattr(case, name)[0])), f"bad k_scale {bad}: K {name} written"
            assert torch.equal(raw(got[1]), raw(getattr(as_floats, name)[1])), f"bad k_scale {bad}: V {name} differs"


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_slot_mapping_of_the_page_table_targets(device, index_dtype):
    """The slot-mapping variant with the slots of the page table's targets, padding rows (-1), a slot
    past the cache and fewer slots than rows."""
    case = make_append_case(batch_size=5, max_tokens=40, page_size=16, seed=71)
    num_pages, page_size = page_geometry(case)
    rows, page, entry = reference.resolve_targets(
        case.batch_indices, case.positions, case.kv_indices, case.kv_indptr, case.kv_last_page_len, num_pages, page_size
    )
    slots = torch.full((case.append_key.shape[0],), -1, dtype=torch.int64)
    slots[rows] = page * page_size + entry
    slots[::7] = -1  # padding
    slots[1] = num_pages * page_size  # past the cache: skipped
    slots = slots[:-1].to(index_dtype)

    def append(fn, c):
        fn(
            c.append_key,
            c.append_value,
            slots.to(c.append_key.device),
            c.paged_kv_cache,
            c.kv_cache_sf,
            c.k_scale,
            c.v_scale,
            c.kv_layout,
        )
        return c

    ours = append(nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, case.to(device))
    if device != "cpu":
        on_cpu = append(nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, case.cloned())
        torch.cuda.synchronize()
        assert_same_caches(ours, on_cpu, f"{device} vs CPU:")
    theirs = append(reference.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping, case.cloned())
    assert_same_caches(ours, theirs, f"{device} vs reference:")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("v_sf_layout,scale_search", [("trtllm", "none"), ("linear", "4over6"), ("trtllm", "4over6")])
def test_optional_formats(device, layout, v_sf_layout, scale_search):
    """V-scale layouts and the 4-over-6 scale search on decode, prefill and a large prefill (the CUDA
    pair kernel)."""
    for decode, head_dim, batch_size, max_tokens in [(True, 64, 5, 40), (False, 128, 3, 40), (False, 128, 4, 600)]:
        seed = head_dim + batch_size
        case = make_append_case(
            layout=layout,
            head_dim=head_dim,
            page_size=16,
            batch_size=batch_size,
            max_tokens=max_tokens,
            decode=decode,
            num_heads=8,
            seed=seed,
        )
        assert_append_matches(
            case,
            device,
            f"seed {seed}, decode {decode}, max_tokens {max_tokens}:",
            reference_on_cuda=max_tokens < 100,
            v_sf_layout=v_sf_layout,
            scale_search=scale_search,
        )


def test_only_target_bytes_change(device):
    """The op writes exactly the target rows: every other byte keeps its poison."""
    case = make_append_case(layout="NHD", stacked=False, head_dim=32, num_heads=2, page_size=4, seed=21)
    appended = case.to(device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*appended.args())
    written = torch.zeros(case.paged_kv_cache[0].shape[:3], dtype=torch.bool)
    page_of = lambda b, p: int(case.kv_indices[int(case.kv_indptr[b]) + p // 4])  # noqa: E731
    for b, p in zip(case.batch_indices.tolist(), case.positions.tolist()):
        written[page_of(b, p), p % 4, :] = True
    unchanged = ~written
    for name in ("paged_kv_cache", "kv_cache_sf"):
        for half in (0, 1):
            old, new = getattr(case, name)[half], getattr(appended, name)[half].cpu()
            assert torch.equal(old.view(torch.uint8)[unchanged], new.view(torch.uint8)[unchanged]), f"{name}[{half}]"
    # The written rows do change (the poison is random, so a real write differs somewhere).
    assert not torch.equal(case.paged_kv_cache[0][written], appended.paged_kv_cache[0].cpu()[written])


def test_empty_append_writes_nothing(device):
    case = make_append_case(seed=2)
    empty = dataclasses.replace(
        case,
        append_key=case.append_key[:0],
        append_value=case.append_value[:0],
        batch_indices=case.batch_indices[:0],
        positions=case.positions[:0],
    )
    appended = empty.to(device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*appended.args())
    assert_same_caches(appended, empty)


@pytest.mark.parametrize("repeat", range(8))
def test_fresh_random_cases(device, repeat):
    """Fresh inputs on every run: a different random case each time the test suite runs."""
    fresh = int(torch.randint(0, 2**31 - 1, (1,)))
    g = torch.Generator().manual_seed(fresh)
    pick = lambda options: options[int(torch.randint(0, len(options), (1,), generator=g))]  # noqa: E731
    case = make_append_case(
        head_dim=pick(HEAD_DIMS),
        page_size=pick(PAGE_SIZES),
        layout=pick(["NHD", "HND"]),
        stacked=pick([False, True]),
        dtype=pick([torch.float16, torch.bfloat16]),
        index_dtype=pick([torch.int32, torch.int64]),
        strided_input=pick([False, True]),
        strided_cache=pick([False, True]),
        decode=pick([False, True]),
        seed=fresh,
    )
    assert_append_matches(case, device, f"seed {fresh} (make_append_case options drawn from it):")
