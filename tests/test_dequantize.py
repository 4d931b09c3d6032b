"""nvfp4kv.dequantize on every device present against the reference, and on CUDA against the CPU op
too: quantized rows, arbitrary codes and scale bytes (NaN scales included) from aligned and misaligned
buffers, and strided cache views."""

import torch
from conftest import misaligned_copy

import nvfp4kv
from nvfp4kv import reference

from append_cases import make_append_case


def test_dequantize_matches_reference(device):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, 64, generator=g) * 7
    packed, scales = reference.quantize(x, 0.01)
    ours = nvfp4kv.dequantize(packed.to(device), scales.to(device), 0.01)
    theirs = reference.dequantize(packed, scales, 0.01)
    assert ours.dtype == torch.float32 and ours.shape == (5, 3, 64)
    assert torch.equal(ours.cpu().view(torch.int32), theirs.view(torch.int32))


def test_dequantize_of_arbitrary_bytes(device):
    """Every code and scale byte may come up (0x7F and 0xFF are NaN scales, 0x00 a zero one); NaN
    payloads aside, the float32 bits match, from aligned buffers and from misaligned ones."""
    g = torch.Generator().manual_seed(5)
    packed = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (3, 5, 8), dtype=torch.uint8, generator=g)
    scales[0, 0, :3] = torch.tensor([0x7F, 0xFF, 0x00], dtype=torch.uint8)  # NaN, -NaN, 0
    scales = scales.view(torch.float8_e4m3fn)
    for alignment, (p, s) in (
        ("aligned", (packed.to(device), scales.to(device))),
        ("misaligned", (misaligned_copy(packed.to(device), 3), misaligned_copy(scales.to(device), 1))),
    ):
        ours = nvfp4kv.dequantize(p, s, 0.37).cpu()
        expected = {"reference": reference.dequantize(packed, scales, 0.37)}
        if device != "cpu":
            expected["CPU"] = nvfp4kv.dequantize(p.cpu(), s.cpu(), 0.37)
        for name, theirs in expected.items():
            assert torch.equal(ours.isnan(), theirs.isnan()), f"{alignment}: NaNs differ from the {name}'s"
            assert torch.equal(ours.nan_to_num(123.0).view(torch.int32), theirs.nan_to_num(123.0).view(torch.int32)), (
                f"{alignment}: values differ from the {name}'s"
            )


def test_dequantize_of_a_strided_cache_view(device):
    case = make_append_case(stacked=True, strided_cache=True, head_dim=64, seed=6)
    k_cache, k_sf = case.paged_kv_cache[:, 0], case.kv_cache_sf[:, 0]
    on_device = case.to(device)
    ours = nvfp4kv.dequantize(on_device.paged_kv_cache[:, 0], on_device.kv_cache_sf[:, 0], 0.5).cpu()
    theirs = reference.dequantize(k_cache.contiguous(), k_sf.contiguous(), 0.5)
    assert torch.equal(torch.nan_to_num(ours, nan=7.0), torch.nan_to_num(theirs, nan=7.0))
