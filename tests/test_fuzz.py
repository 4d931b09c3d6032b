"""Property tests (hypothesis): random valid inputs, random corrupted index data and random bad
metadata. The op must agree byte for byte with the reference, write nothing outside the valid rows'
targets, and reject bad metadata with a named error and untouched caches. Runs on every device
present (CPU in CI; CUDA too on a GPU machine, where it also runs under compute-sanitizer)."""

import dataclasses
import os

import pytest
import torch
from conftest import FUZZ, assert_append_matches, assert_same_caches, page_geometry
from hypothesis import assume, given
from hypothesis import strategies as st

import nvfp4kv
from nvfp4kv import reference

from append_cases import cache_bytes, make_append_case

case_options = st.fixed_dictionaries(
    {
        "num_heads": st.integers(1, 4),
        "head_dim": st.sampled_from([16, 32, 48, 64, 80, 128, 192, 256, 512]),
        "page_size": st.sampled_from([1, 2, 3, 5, 16, 64]),
        "batch_size": st.integers(1, 5),
        "max_tokens": st.integers(1, 70),
        "decode": st.booleans(),
        "layout": st.sampled_from(["NHD", "HND"]),
        "stacked": st.booleans(),
        "strided_cache": st.booleans(),
        "strided_input": st.booleans(),
        "dtype": st.sampled_from([torch.float16, torch.bfloat16]),
        "index_dtype": st.sampled_from([torch.int32, torch.int64]),
        "seed": st.integers(0, 2**31 - 1),
    }
)


def has_duplicate_targets(case) -> bool:
    num_pages, page_size = page_geometry(case)
    _, page, entry = reference.resolve_targets(
        case.batch_indices,
        case.positions,
        case.kv_indices,
        case.kv_indptr,
        case.kv_last_page_len,
        num_pages,
        page_size,
        keep_duplicates=True,
    )
    slots = page * page_size + entry
    return slots.unique().numel() != slots.numel()


@FUZZ
@given(options=case_options)
def test_valid_inputs_match_the_reference(device, options):
    assert_append_matches(make_append_case(**options), device)


huge = 2**62
bad_value = st.one_of(st.integers(-5, -1), st.integers(0, 200), st.sampled_from([2**31 - 1, -(2**31), huge, -huge]))


@FUZZ
@given(options=case_options, data=st.data())
def test_corrupted_indices_write_only_the_valid_rows(device, options, data):
    case = make_append_case(**options)
    int32 = case.kv_indices.dtype == torch.int32
    value = bad_value.filter(lambda v: not int32 or -(2**31) <= v < 2**31)
    for name in ("batch_indices", "positions", "kv_indices", "kv_indptr"):
        tensor = getattr(case, name).clone()
        if tensor.numel() == 0:
            continue
        for _ in range(data.draw(st.integers(0, 3), label=f"{name} corruptions")):
            tensor[data.draw(st.integers(0, tensor.numel() - 1))] = data.draw(value)
        setattr(case, name, tensor)
    if has_duplicate_targets(case):
        if device == "cuda":
            assume(False)  # which of two rows wins one slot is unspecified on the GPU
        torch.set_num_threads(1)  # single-threaded CPU keeps the last, like the reference
    try:
        assert_append_matches(case, device)
    finally:
        torch.set_num_threads(os.cpu_count() or 1)


def _bad_metadata():
    """(field, mutation) pairs that break one precondition each."""
    return st.sampled_from(
        [
            ("append_key", lambda c: c.append_key.float()),
            ("append_key", lambda c: c.append_key[..., :8]),
            ("append_value", lambda c: c.append_value[:, :1] if c.append_value.shape[1] > 1 else c.append_value[:0]),
            ("batch_indices", lambda c: c.batch_indices.float()),
            ("positions", lambda c: c.positions[:-1] if c.positions.numel() else c.positions[None]),
            ("kv_indices", lambda c: c.kv_indices[None]),
            ("kv_indptr", lambda c: c.kv_indptr[1:]),
            ("kv_last_page_len", lambda c: c.kv_last_page_len.to(torch.int16)),
            ("kv_layout", lambda c: "NHDX"),
            ("k_scale", lambda c: -c.k_scale),
            ("v_scale", lambda c: float("nan")),
            (
                "kv_cache_sf",
                lambda c: (
                    c.kv_cache_sf.view(torch.uint8)
                    if isinstance(c.kv_cache_sf, torch.Tensor)
                    else (c.kv_cache_sf[0].view(torch.uint8), c.kv_cache_sf[1])
                ),
            ),
            (
                "paged_kv_cache",
                lambda c: (
                    c.paged_kv_cache[..., :-1]
                    if isinstance(c.paged_kv_cache, torch.Tensor)
                    else (c.paged_kv_cache[0], c.paged_kv_cache[1][..., :-1])
                ),
            ),
        ]
    )


@FUZZ
@given(options=case_options, bad=_bad_metadata())
def test_bad_metadata_raises_and_writes_nothing(device, options, bad):
    name, mutate = bad
    case = make_append_case(**options).to(device)
    broken = dataclasses.replace(case, **{name: mutate(case)})
    data_before, sf_before = cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf)
    with pytest.raises(ValueError, match=r"^nvfp4kv\.append_paged_kv_cache: "):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*broken.args())
    assert torch.equal(cache_bytes(case.paged_kv_cache), data_before)
    assert torch.equal(cache_bytes(case.kv_cache_sf), sf_before)


def test_cpu_threads_calling_concurrently_are_safe():
    """Several Python threads appending into disjoint caches at once give the sequential bytes."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [make_append_case(seed=s, head_dim=128, num_heads=4, max_tokens=200, batch_size=4) for s in range(8)]
    sequential = [c.cloned() for c in cases]
    for c in sequential:
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*c.args())
    concurrent = [c.cloned() for c in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda c: nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*c.args()), concurrent))
    for seed, (a, b) in enumerate(zip(sequential, concurrent)):
        assert_same_caches(a, b, f"seed {seed}:")
