"""GPU reliability: 64-bit addressing, concurrent streams, a non-default device. Skips without CUDA.
(The fuzz tests of tests/test_fuzz.py also run on CUDA there, and under compute-sanitizer.)"""

import pytest
import torch
from conftest import assert_same_caches, has_cuda

import nvfp4kv
from nvfp4kv import reference

from append_cases import cache_bytes, make_append_case

pytestmark = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU and a build with the CUDA kernels")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cache_larger_than_4_gib_written_at_its_last_page(index_dtype, layout):
    """Each K/V cache tensor is 4.5 GiB, so the last page's byte offsets need more than 32 bits."""
    heads, head_dim, page_size = 8, 128, 16
    page_bytes = page_size * heads * head_dim // 2
    num_pages = (9 << 29) // page_bytes  # 4.5 GiB per tensor
    inner = (page_size, heads) if layout == "NHD" else (heads, page_size)
    try:
        k_cache = torch.full((num_pages, *inner, head_dim // 2), 0x5A, dtype=torch.uint8, device="cuda")
        v_cache = torch.full_like(k_cache, 0x5A)
        k_sf = torch.full((num_pages, *inner, head_dim // 16), 0x11, dtype=torch.uint8, device="cuda")
        v_sf = torch.full_like(k_sf, 0x11)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a 9 GiB cache")
    assert k_cache.numel() > 2**32
    g = torch.Generator().manual_seed(50)
    nnz = 2 * page_size
    key = torch.randn(nnz, heads, head_dim, generator=g).to(torch.bfloat16)
    value = torch.randn(nnz, heads, head_dim, generator=g).to(torch.bfloat16)
    # One request whose two pages are the last two of the cache, last one first.
    kv_indices = torch.tensor([num_pages - 1, num_pages - 2], dtype=index_dtype)
    kv_indptr = torch.tensor([0, 2], dtype=index_dtype)
    batch_indices = torch.zeros(nnz, dtype=index_dtype)
    positions = torch.arange(nnz, dtype=index_dtype)
    last = torch.tensor([page_size], dtype=index_dtype)
    cuda = lambda t: t.cuda()  # noqa: E731
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        cuda(key),
        cuda(value),
        cuda(batch_indices),
        cuda(positions),
        (k_cache, v_cache),
        (k_sf.view(torch.float8_e4m3fn), v_sf.view(torch.float8_e4m3fn)),
        cuda(kv_indices),
        cuda(kv_indptr),
        cuda(last),
        0.01,
        0.02,
        layout,
    )
    torch.cuda.synchronize()
    # The same append on a small CPU cache whose pages 0/1 stand for the last two pages.
    small = lambda fill, w: torch.full((2, *inner, w), fill, dtype=torch.uint8)  # noqa: E731
    ref_k, ref_v, ref_k_sf, ref_v_sf = (
        small(0x5A, head_dim // 2),
        small(0x5A, head_dim // 2),
        small(0x11, head_dim // 16),
        small(0x11, head_dim // 16),
    )
    reference.nvfp4_quantize_append_paged_kv_cache(
        key,
        value,
        batch_indices,
        positions,
        (ref_k, ref_v),
        (ref_k_sf.view(torch.float8_e4m3fn), ref_v_sf.view(torch.float8_e4m3fn)),
        torch.tensor([1, 0]),
        torch.tensor([0, 2]),
        last.long(),
        0.01,
        0.02,
        layout,
    )
    for big, ref in ((k_cache, ref_k), (v_cache, ref_v), (k_sf, ref_k_sf), (v_sf, ref_v_sf)):
        assert torch.equal(big[-2:].cpu(), ref)
        assert bool((big[:-2] == big[0, 0, 0, 0]).all())  # nothing else written anywhere in 4.5 GiB
    del k_cache, v_cache, k_sf, v_sf
    torch.cuda.empty_cache()


def test_two_streams_into_disjoint_pages_equal_sequential():
    first = make_append_case(seed=51, stacked=True, head_dim=128, num_heads=8, max_tokens=300, batch_size=4)
    second = make_append_case(seed=52, stacked=True, head_dim=128, num_heads=8, max_tokens=300, batch_size=4)
    # The second case writes the same cache but only into pages the first does not use.
    shift = int(first.kv_indices.max()) + 1
    pages = first.paged_kv_cache.shape[0]
    big = lambda t, n: torch.cat([t, t[:n]]) if n > 0 else t  # noqa: E731
    extra = max(0, shift + int(second.kv_indices.max()) + 1 - pages)
    cache, cache_sf = big(first.paged_kv_cache, extra), big(first.kv_cache_sf, extra)
    second.kv_indices = second.kv_indices + shift
    first = first.with_caches(cache, cache_sf).to("cuda")
    second = second.to("cuda").with_caches(first.paged_kv_cache, first.kv_cache_sf)
    sequential = first.cloned()
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*sequential.args())
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        *second.with_caches(sequential.paged_kv_cache, sequential.kv_cache_sf).args()
    )
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    for stream, case in zip(streams, (first, second)):
        with torch.cuda.stream(stream):
            for _ in range(20):  # repeat to overlap the two streams' kernels
                nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*case.args())
    torch.cuda.synchronize()
    assert_same_caches(first, sequential)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")
@pytest.mark.parametrize("scale_search", ["none", "4over6"])
def test_second_gpu(scale_search):
    """Every op follows its tensors to cuda:1 while cuda:0 is current (a device guard, the right stream),
    large calls (the pair kernel) included; tensors on two GPUs are refused before anything is written."""
    small = make_append_case(seed=53, stacked=True)
    large = make_append_case(seed=54, head_dim=128, num_heads=8, batch_size=16, max_tokens=400)
    for size, case in (("small", small), ("large", large)):
        on_cpu, on_gpu1 = case.cloned(), case.cloned().to("cuda:1")
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*on_cpu.args(), scale_search=scale_search)
        with torch.cuda.device(0):  # the op must follow the tensors, not the current device
            nvfp4kv.nvfp4_quantize_append_paged_kv_cache(*on_gpu1.args(), scale_search=scale_search)
            slots = torch.arange(3, device="cuda:1")
            slotted_cpu, slotted_gpu1 = case.cloned(), case.cloned().to("cuda:1")
            for c, s in ((slotted_cpu, slots.cpu()), (slotted_gpu1, slots)):
                nvfp4kv.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
                    c.append_key,
                    c.append_value,
                    s,
                    c.paged_kv_cache,
                    c.kv_cache_sf,
                    c.k_scale,
                    c.v_scale,
                    c.kv_layout,
                    scale_search=scale_search,
                )
            read_back = nvfp4kv.dequantize_paged_kv_cache(
                on_gpu1.paged_kv_cache,
                on_gpu1.kv_cache_sf,
                on_gpu1.kv_indices,
                on_gpu1.kv_indptr,
                on_gpu1.kv_last_page_len,
                case.k_scale,
                case.v_scale,
                case.kv_layout,
            )
        torch.cuda.synchronize(1)
        for variant, gpu, cpu in (("page table", on_gpu1, on_cpu), ("slot mapping", slotted_gpu1, slotted_cpu)):
            assert_same_caches(gpu, cpu, f"{size} case, {variant}:")
        assert read_back[0].device == torch.device("cuda:1")
        expected = nvfp4kv.dequantize_paged_kv_cache(
            on_cpu.paged_kv_cache,
            on_cpu.kv_cache_sf,
            on_cpu.kv_indices,
            on_cpu.kv_indptr,
            on_cpu.kv_last_page_len,
            case.k_scale,
            case.v_scale,
            case.kv_layout,
        )
        # Entries the call did not write hold the poison, which may decode to NaN, and torch's own bf16
        # conversion writes NaN as 0x7FC0 on the CPU, 0x7FFF on CUDA: equal values, NaN where NaN.
        for a, b in zip(read_back, expected):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0, equal_nan=True)
    mixed = small.cloned().to("cuda:1")
    before = cache_bytes(mixed.paged_kv_cache).clone()
    with pytest.raises(
        ValueError,
        match=r"append_value must be on the same device as append_key \(cuda:1\), "
        r"got cuda:0",
    ):
        nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
            mixed.append_key, mixed.append_value.to("cuda:0"), *mixed.args()[2:]
        )
    assert torch.equal(cache_bytes(mixed.paged_kv_cache), before)
