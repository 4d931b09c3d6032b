"""Global scales near the top of float32: 6 s (and 4 s) overflow to inf, so a block holding an
infinity divides inf by inf. Every device must write the bytes the reference writes."""

import pytest
import torch

import nvfp4kv
from nvfp4kv import reference


def one_block_cache(device):
    cache = torch.full((1, 2, 1, 1, 8), 0xA5, dtype=torch.uint8, device=device)
    cache_sf = torch.full((1, 2, 1, 1, 1), 0x5A, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    return cache, cache_sf


@pytest.mark.parametrize("scale", [1e37, 5.7e37, 1e38, 3.4e38])
@pytest.mark.parametrize("special", ["inf", "-inf", "nan", "max_bf16"])
@pytest.mark.parametrize("scale_search", ["none", "4over6"])
def test_extreme_scale_with_special_values(device, scale, special, scale_search):
    values = torch.linspace(-3, 3, 16)
    values[5] = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan"), "max_bf16": 3.38e38}[special]
    row = values.to(torch.bfloat16).reshape(1, 1, 16).to(device)
    index = torch.zeros(1, dtype=torch.int32, device=device)
    indptr = torch.tensor([0, 1], dtype=torch.int32, device=device)
    last = torch.ones(1, dtype=torch.int32, device=device)
    cache, cache_sf = one_block_cache(device)
    nvfp4kv.nvfp4_quantize_append_paged_kv_cache(
        row, row, index, index, cache, cache_sf, index, indptr, last, scale, scale, "NHD", scale_search=scale_search
    )
    expected, expected_sf = one_block_cache("cpu")
    reference.nvfp4_quantize_append_paged_kv_cache(
        row.cpu(),
        row.cpu(),
        index.cpu(),
        index.cpu(),
        expected,
        expected_sf,
        index.cpu(),
        indptr.cpu(),
        last.cpu(),
        scale,
        scale,
        "NHD",
        scale_search=scale_search,
    )
    assert torch.equal(cache.cpu(), expected), (cache.cpu().flatten().tolist(), expected.flatten().tolist())
    assert torch.equal(cache_sf.view(torch.uint8).cpu(), expected_sf.view(torch.uint8)), (
        cache_sf.view(torch.uint8).cpu().flatten().tolist(),
        expected_sf.view(torch.uint8).flatten().tolist(),
    )
