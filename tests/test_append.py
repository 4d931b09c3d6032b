"""Byte equality of the CPU op against nvfp4kv.reference on random cases, with poisoned caches.

Caches start as random bytes; the op and the reference each run on their own copy; the WHOLE
storage behind each cache must match afterwards, so a byte written in the wrong place, or not
written, fails. test_only_target_bytes_change proves the written set is exactly the target rows.
"""

import itertools

import pytest
import torch

import nvfp4kv
from nvfp4kv import reference
from append_cases import cache_bytes, make_append_case


def run_both(case):
    """Runs the op and the reference on separate copies; returns (op_case, reference_case)."""
    ours, theirs = case.cloned(), case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*ours.args())
    reference.nvfp4_quantize_append_paged_kv_cache(*theirs.args())
    return ours, theirs


def assert_same_caches(ours, theirs):
    for name in ("paged_kv_cache", "kv_cache_sf"):
        a, b = cache_bytes(getattr(ours, name)), cache_bytes(getattr(theirs, name))
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} of {a.numel()} bytes differ"


HEAD_DIMS = [16, 48, 64, 80, 128, 192, 256, 512]
PAGE_SIZES = [1, 5, 16, 64]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_head_dims_and_page_sizes(head_dim, page_size):
    seed = HEAD_DIMS.index(head_dim) * 10 + PAGE_SIZES.index(page_size)
    case = make_append_case(head_dim=head_dim, page_size=page_size, num_heads=2, seed=seed,
                            max_tokens=3 * page_size + 2, layout="NHD" if seed % 2 else "HND")
    assert_same_caches(*run_both(case))


@pytest.mark.parametrize(
    "layout,stacked,dtype,index_dtype",
    list(itertools.product(["NHD", "HND"], [False, True], [torch.float16, torch.bfloat16],
                           [torch.int32, torch.int64])))
def test_layouts_caches_dtypes_indices(layout, stacked, dtype, index_dtype):
    case = make_append_case(layout=layout, stacked=stacked, dtype=dtype, index_dtype=index_dtype, head_dim=128,
                            num_heads=4, page_size=16, batch_size=4, seed=hash((layout, stacked, str(dtype))) % 1000)
    assert_same_caches(*run_both(case))


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_strided_inputs_and_cache_views(layout, stacked):
    case = make_append_case(layout=layout, stacked=stacked, strided_input=True, strided_cache=True, head_dim=64,
                            page_size=5, seed=7)
    assert not case.append_key.is_contiguous()
    assert_same_caches(*run_both(case))


def test_tuple_of_stacked_halves():
    """Tuple caches that are the two halves of one stacked tensor, as engines often hold them."""
    case = make_append_case(stacked=True, seed=11)
    halves = case.with_caches(case.paged_kv_cache.unbind(1), case.kv_cache_sf.unbind(1))
    assert_same_caches(*run_both(halves))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_step(layout):
    case = make_append_case(decode=True, batch_size=9, layout=layout, seed=3)
    assert case.append_key.shape[0] == 9
    assert_same_caches(*run_both(case))


def test_large_prefill_uses_threads():
    case = make_append_case(head_dim=128, num_heads=8, page_size=16, batch_size=4, max_tokens=600, seed=5)
    assert_same_caches(*run_both(case))


@pytest.mark.parametrize("seed", range(8))
def test_fresh_random_cases(seed):
    """Fresh inputs on every run: a different random case each time the test suite runs."""
    fresh = int(torch.randint(0, 2**31 - 1, (1,)))
    g = torch.Generator().manual_seed(fresh)
    pick = lambda options: options[int(torch.randint(0, len(options), (1,), generator=g))]  # noqa: E731
    case = make_append_case(head_dim=pick(HEAD_DIMS), page_size=pick(PAGE_SIZES), layout=pick(["NHD", "HND"]),
                            stacked=pick([False, True]), dtype=pick([torch.float16, torch.bfloat16]),
                            index_dtype=pick([torch.int32, torch.int64]), strided_input=pick([False, True]),
                            strided_cache=pick([False, True]), decode=pick([False, True]), seed=fresh)
    assert_same_caches(*run_both(case)), f"seed {fresh}"


def test_only_target_bytes_change():
    """The op writes exactly the target rows: every other byte keeps its poison."""
    case = make_append_case(layout="NHD", stacked=False, head_dim=32, num_heads=2, page_size=4, seed=21)
    before = case.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
    k_before, k_after = before.paged_kv_cache[0], case.paged_kv_cache[0]
    written = torch.zeros(k_after.shape[:3], dtype=torch.bool)
    page_of = lambda b, p: int(case.kv_indices[int(case.kv_indptr[b]) + p // 4])  # noqa: E731
    for b, p in zip(case.batch_indices.tolist(), case.positions.tolist()):
        written[page_of(b, p), p % 4, :] = True
    unchanged = ~written
    for name in ("paged_kv_cache", "kv_cache_sf"):
        for half in (0, 1):
            old, new = getattr(before, name)[half], getattr(case, name)[half]
            assert torch.equal(old.view(torch.uint8)[unchanged], new.view(torch.uint8)[unchanged])
    # The written rows do change (the poison is random, so a real write differs somewhere).
    assert not torch.equal(k_before[written], k_after[written])


def test_empty_append_writes_nothing():
    case = make_append_case(seed=2)
    empty = make_append_case(seed=2)
    empty.append_key, empty.append_value = case.append_key[:0], case.append_value[:0]
    empty.batch_indices, empty.positions = case.batch_indices[:0], case.positions[:0]
    before = empty.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*empty.args())
    assert torch.equal(cache_bytes(before.paged_kv_cache), cache_bytes(empty.paged_kv_cache))


def test_out_of_range_rows_are_skipped():
    """Index data never causes an out-of-bounds write: bad rows are skipped, good rows still land."""
    case = make_append_case(batch_size=3, page_size=4, max_tokens=12, seed=9, index_dtype=torch.int64)
    nnz = case.append_key.shape[0]
    assert nnz >= 4
    case.batch_indices = case.batch_indices.clone()
    case.positions = case.positions.clone()
    case.batch_indices[0] = 3          # batch index out of range
    case.positions[1] = -1             # negative position
    case.positions[2] = 10**6          # page slot beyond the request's pages
    kv_indices = case.kv_indices.clone()
    kv_indices[int(case.kv_indptr[int(case.batch_indices[3])]) + int(case.positions[3]) // 4] = 10**9  # bad page
    case.kv_indices = kv_indices
    assert_same_caches(*run_both(case))


def test_dequantize_matches_reference():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, 64, generator=g) * 7
    packed, scales = reference.quantize(x, 0.01)
    ours = nvfp4kv.dequantize(packed, scales, 0.01)
    theirs = reference.dequantize(packed, scales, 0.01)
    assert ours.dtype == torch.float32 and ours.shape == (5, 3, 64)
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_dequantize_of_a_strided_cache_view():
    case = make_append_case(stacked=True, strided_cache=True, head_dim=64, seed=6)
    k_cache, k_sf = case.paged_kv_cache[:, 0], case.kv_cache_sf[:, 0]
    ours = nvfp4kv.dequantize(k_cache, k_sf, 0.5)
    theirs = reference.dequantize(k_cache.contiguous(), k_sf.contiguous(), 0.5)
    assert torch.equal(torch.nan_to_num(ours, nan=7.0), torch.nan_to_num(theirs, nan=7.0))
