"""torch.compile in every mode the README documents, for every way of holding the caches.

Separate allocations and a stacked cache must give the eager bytes in every mode, through
recompilations (dynamic=None with a changing batch) and under mark_dynamic. Caches sharing one
storage (the two halves of a stacked tensor, two halves of one pool) are miscompiled by PyTorch
under dynamic shapes (wrong bytes, failed compiles), so every traced call refuses them before
anything runs, with a message that says what to pass instead.
"""

import pytest
import torch

import nvfp4kv

from append_cases import cache_bytes, make_append_case

HOLDINGS = ["separate", "stacked", "halves", "pool"]
MODES = ["dynamic_true", "dynamic_none", "dynamic_false", "mark_dynamic"]
SHARED_STORAGE = ("halves", "pool")


def hold(case, holding):
    """The case's caches held as `holding`; the bytes (poison included) are the case's."""
    k, v = case.paged_kv_cache
    k_sf, v_sf = case.kv_cache_sf
    if holding == "separate":
        return case.with_caches((k.clone(), v.clone()), (k_sf.clone(), v_sf.clone()))
    if holding == "stacked":
        return case.with_caches(torch.stack([k, v], 1), torch.stack([k_sf, v_sf], 1))
    if holding == "halves":
        return case  # make_append_case's tuples are the halves of one stacked tensor
    pool, pool_sf = torch.cat([k, v]), torch.cat([k_sf, v_sf])  # [2 * pages, ...]: K pages, then V pages
    pages = k.shape[0]
    return case.with_caches((pool[:pages], pool[pages:]), (pool_sf[:pages], pool_sf[pages:]))


def append(*args):
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*args)


def compiled_append(mode):
    dynamic = {"dynamic_true": True, "dynamic_none": None, "dynamic_false": False, "mark_dynamic": None}[mode]
    return torch.compile(append, fullgraph=True, dynamic=dynamic)


def call(fn, case, mode):
    if mode == "mark_dynamic":
        for t in (case.append_key, case.append_value, case.batch_indices, case.positions):
            torch._dynamo.mark_dynamic(t, 0)
    fn(*case.args())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("holding", HOLDINGS)
def test_compiled_append_equals_eager_or_is_refused(holding, mode, device):
    torch._dynamo.reset()
    fn = compiled_append(mode)
    # A changing batch (nnz 1..40): dynamic=None recompiles with dynamic shapes on the second call.
    for seed, batch_size in ((1, 3), (2, 5), (3, 2), (4, 6)):
        case = hold(
            make_append_case(seed=seed, batch_size=batch_size, num_heads=2, head_dim=32, page_size=4), holding
        ).to(device)
        eager = case.cloned()
        append(*eager.args())
        before = cache_bytes(case.paged_kv_cache), cache_bytes(case.kv_cache_sf)
        if holding in SHARED_STORAGE:
            with pytest.raises(Exception, match="shares its storage with .* pass K and V as one stacked tensor"):
                call(fn, case, mode)
            assert torch.equal(cache_bytes(case.paged_kv_cache), before[0]), f"seed {seed}"
            assert torch.equal(cache_bytes(case.kv_cache_sf), before[1]), f"seed {seed}"
            continue
        call(fn, case, mode)
        assert torch.equal(cache_bytes(case.paged_kv_cache), cache_bytes(eager.paged_kv_cache)), f"seed {seed}"
        assert torch.equal(cache_bytes(case.kv_cache_sf), cache_bytes(eager.kv_cache_sf)), f"seed {seed}"


@pytest.mark.parametrize("holding", SHARED_STORAGE)
def test_shared_storage_caches_are_accepted_eagerly(holding):
    """The refusal is the compiler's: an eager call writes such caches correctly."""
    case = hold(make_append_case(seed=7, num_heads=2, head_dim=32, page_size=4), holding)
    reference = hold(make_append_case(seed=7, num_heads=2, head_dim=32, page_size=4), "separate")
    append(*case.args())
    append(*reference.args())
    for got, want in ((case.paged_kv_cache, reference.paged_kv_cache), (case.kv_cache_sf, reference.kv_cache_sf)):
        assert torch.equal(got[0].contiguous().view(torch.uint8), want[0].view(torch.uint8))
        assert torch.equal(got[1].contiguous().view(torch.uint8), want[1].view(torch.uint8))
