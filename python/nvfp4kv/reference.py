"""Pure-PyTorch reference of the NVFP4 KV-cache writer (SPEC.md sections 1 and 2).

This module is the test oracle: it is written for exactness and readability, not speed, and depends on torch only
(it never loads the compiled library). Every floating-point step is an IEEE float32 tensor operation in the order
the spec gives, so its bytes are the bytes the CPU and CUDA kernels must produce.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "quantize",
    "dequantize",
    "nvfp4_quantize_append_paged_kv_cache",
    "round_to_e4m3_code",
    "round_to_e2m1_code",
]

BLOCK_SIZE = 16
E4M3_MAX_CODE = 0x7E  # 448.0, the largest finite float8_e4m3fn
E4M3_NAN_CODE = 0x7F
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # indexed by the low 3 bits of a code
E2M1_SIGN_BIT = 0x8

KVCache = Union[Tensor, Tuple[Tensor, Tensor]]


def _fp32(value: float) -> Tensor:
    """A Python float rounded (to nearest even) to a float32 scalar tensor."""
    return torch.tensor(value, dtype=torch.float32)


def _exact_power_of_two(exponent: Tensor) -> Tensor:
    """2**exponent as float32, built from its bit pattern so no libm rounding can creep in.

    Only valid for the normal range, -126 <= exponent <= 127.
    """
    return ((exponent.to(torch.int32) + 127) << 23).view(torch.float32)


def round_to_e4m3_code(t: Tensor) -> Tensor:
    """float8_e4m3fn bit patterns (uint8) of non-negative float32 values, SPEC section 2 step 4.

    Round to nearest, ties to even; saturate to 448 (0x7E) for t >= 448, for +inf and, as a deterministic choice the
    spec leaves open, for NaN; subnormals (multiples of 2**-9 below 2**-6) are kept.
    """
    saturate = ~(t < 448.0)  # true for t >= 448, +inf and NaN
    t = torch.where(saturate, 0.0, t)

    # E4M3 has 3 mantissa bits: inside the binade [2**e, 2**(e+1)) representable values are multiples of 2**(e-3).
    # Below 2**-6 (the smallest normal) the spacing stays 2**-9, so the binade is clamped at e = -6.
    # frexp: v = mantissa * 2**exponent with mantissa in [0.5, 1), so floor(log2 v) = exponent - 1.
    _, frexp_exponent = torch.frexp(torch.clamp(t, min=2.0**-6))
    binade = frexp_exponent - 1
    # Scaling by a power of two is exact, so round() (ties to even) sees the true value; steps is in [0, 16].
    steps = torch.round(t * _exact_power_of_two(3 - binade)).to(torch.int32)
    # Code layout s.eeee.mmm with bias 7: a normal value steps * 2**(e-3), steps in [8, 16), has code
    # ((e + 7) << 3) | (steps - 8) = 8 * (e + 6) + steps. With e = -6 the same formula gives the subnormal codes
    # 0..7, and steps == 16 carries into the next exponent exactly as it should.
    code = 8 * (binade + 6) + steps
    return torch.where(saturate, E4M3_MAX_CODE, code).to(torch.uint8)


def round_to_e2m1_code(magnitude: Tensor) -> Tensor:
    """E2M1 magnitude codes 0..7 (uint8) of |y| (float32), SPEC section 2 step 6.

    Each threshold is the midpoint of two neighbouring E2M1 values; on a tie the even code wins, which is why the
    comparisons alternate between > and >=. Values above 5.0, +inf and NaN all get code 7 (6.0).
    """
    m = magnitude
    code = torch.zeros(m.shape, dtype=torch.uint8, device=m.device)
    for reached in (m > 0.25, m >= 0.75, m > 1.25, m >= 1.75, m > 2.5, m >= 3.5, m > 5.0):
        code += reached.to(torch.uint8)
    return torch.where(torch.isnan(m), 7, code).to(torch.uint8)


def _pack_nibbles(codes: Tensor) -> Tensor:
    """[..., D] codes -> [..., D/2] bytes; the even element goes to the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack_nibbles(packed: Tensor) -> Tensor:
    """[..., D/2] bytes -> [..., D] codes, inverse of _pack_nibbles."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def quantize(x: Tensor, global_scale: float) -> Tuple[Tensor, Tensor]:
    """NVFP4-quantize x ([..., D], fp16/bf16/fp32, D % 16 == 0) with the global decode scale.

    Returns (packed uint8 [..., D/2], block scales float8_e4m3fn [..., D/16]), bit-exact to SPEC section 2.
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must have dtype float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(f"x must have a last dimension that is a multiple of {BLOCK_SIZE}, got shape {tuple(x.shape)}")

    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    s = _fp32(global_scale)
    has_nan = torch.isnan(blocks).any(dim=-1)

    a = blocks.abs().amax(dim=-1)  # may be +inf; NaN blocks are overwritten below
    six_s = _fp32(6.0) * s  # rounded to fp32 before the division
    t = a / six_s
    scale_code = round_to_e4m3_code(t)
    sf = scale_code.view(torch.float8_e4m3fn).to(torch.float32)  # exact decode
    r = torch.where((a == 0) | (sf == 0), 0.0, 1.0 / (sf * s))

    y = blocks * r.unsqueeze(-1)
    # The sign bit is signbit(x). It equals signbit(y) except when y is NaN (x == +-0 times r == inf, only for absurdly
    # small s), where signbit(NaN) would be arbitrary; tests/test_reference.py: test_tiny_global_scale_makes_r_infinite.
    sign = torch.signbit(blocks).to(torch.uint8) * E2M1_SIGN_BIT
    codes = sign | round_to_e2m1_code(y.abs())

    codes = torch.where(has_nan.unsqueeze(-1), 0, codes).to(torch.uint8)
    scale_code = torch.where(has_nan, E4M3_NAN_CODE, scale_code).to(torch.uint8)
    packed = _pack_nibbles(codes.flatten(-2))
    return packed, scale_code.view(torch.float8_e4m3fn)


def dequantize(packed: Tensor, scales: Tensor, global_scale: float) -> Tensor:
    """float32 [..., D] values e2m1(code) * float(sf) * s, multiplied left to right in fp32."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must have dtype uint8, got {packed.dtype}")
    if scales.dtype != torch.float8_e4m3fn:
        raise TypeError(f"scales must have dtype float8_e4m3fn, got {scales.dtype}")
    if packed.shape[-1] * 2 != scales.shape[-1] * BLOCK_SIZE or packed.shape[:-1] != scales.shape[:-1]:
        raise ValueError(
            f"packed [..., D/2] and scales [..., D/16] must describe the same rows, got {tuple(packed.shape)} "
            f"and {tuple(scales.shape)}"
        )
    codes = _unpack_nibbles(packed)
    magnitude = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=packed.device)[(codes & 0x7).long()]
    e2m1 = torch.where((codes & E2M1_SIGN_BIT) != 0, -magnitude, magnitude)
    sf = scales.to(torch.float32).repeat_interleave(BLOCK_SIZE, dim=-1)
    return (e2m1 * sf) * _fp32(global_scale)


def _split_kv(cache: KVCache, name: str) -> Tuple[Tensor, Tensor]:
    """(k, v) 4-D views of a tuple cache or of a stacked 5-D cache with K/V on dim 1."""
    if isinstance(cache, (tuple, list)):
        if len(cache) != 2:
            raise ValueError(f"{name} must be a (k, v) pair, got {len(cache)} tensors")
        return cache[0], cache[1]
    if cache.dim() != 5 or cache.shape[1] != 2:
        raise ValueError(
            f"{name} must be a (k, v) tuple or a 5-D tensor with 2 on dim 1, got shape {tuple(cache.shape)}"
        )
    return cache[:, 0], cache[:, 1]


def _as_nhd(cache: Tensor, kv_layout: str) -> Tensor:
    """A [pages, page_size, heads, last] view of a 4-D cache (HND is [pages, heads, page_size, last])."""
    return cache if kv_layout == "NHD" else cache.transpose(1, 2)


def resolve_targets(
    batch_indices: Tensor,
    positions: Tensor,
    kv_indices: Tensor,
    kv_indptr: Tensor,
    kv_last_page_len: Tensor,
    max_num_pages: int,
    page_size: int,
    keep_duplicates: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(row, page, entry) int64 triples of the rows that land inside the cache; every other row is skipped.

    A row is skipped when b is not in [0, batch_size), p < 0, page_iter = kv_indptr[b] + p // page_size is not in
    [kv_indptr[b], kv_indptr[b+1]) or not in [0, kv_indices.numel()), or page = kv_indices[page_iter] is not in
    [0, max_num_pages). Arithmetic is int64, so no value wraps. When several rows hit the same slot the last one
    wins (a deterministic choice; the spec does not define it) unless keep_duplicates is set.
    """
    batch_size = kv_last_page_len.numel()
    indptr = kv_indptr.long()
    indices = kv_indices.long()
    rows = torch.arange(batch_indices.numel(), device=batch_indices.device)
    b = batch_indices.long()
    p = positions.long()

    keep = (b >= 0) & (b < batch_size) & (p >= 0)
    rows, b, p = rows[keep], b[keep], p[keep]

    page_iter = indptr[b] + torch.div(p, page_size, rounding_mode="floor")
    keep = (page_iter >= indptr[b]) & (page_iter < indptr[b + 1]) & (page_iter >= 0) & (page_iter < indices.numel())
    rows, p, page_iter = rows[keep], p[keep], page_iter[keep]

    page = indices[page_iter]
    keep = (page >= 0) & (page < max_num_pages)
    rows, p, page = rows[keep], p[keep], page[keep]
    entry = p % page_size

    if keep_duplicates:
        return rows, page, entry
    slot = page * page_size + entry
    _, slot_id = torch.unique(slot, return_inverse=True)
    last_row_of_slot = torch.full((rows.numel(),), -1, dtype=torch.int64, device=rows.device)
    last_row_of_slot = last_row_of_slot.scatter_reduce(0, slot_id, rows, "amax")
    is_last = last_row_of_slot[slot_id] == rows
    return rows[is_last], page[is_last], entry[is_last]


def nvfp4_quantize_append_paged_kv_cache(
    append_key: Tensor,
    append_value: Tensor,
    batch_indices: Tensor,
    positions: Tensor,
    paged_kv_cache: KVCache,
    kv_cache_sf: KVCache,
    kv_indices: Tensor,
    kv_indptr: Tensor,
    kv_last_page_len: Tensor,
    k_scale: float,
    v_scale: float,
    kv_layout: str = "NHD",
) -> None:
    """Quantize K/V rows and write them into the paged NVFP4 cache in place (SPEC section 1).

    append_key/append_value: [nnz, heads, head_dim]. Caches: NHD [pages, page_size, heads, head_dim/2] (scales
    head_dim/16), HND [pages, heads, page_size, ...]; as a (k, v) tuple or stacked on dim 1. Rows whose indices fall
    outside the cache are skipped (see resolve_targets); nothing but the target bytes changes.
    """
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    k_cache, v_cache = _split_kv(paged_kv_cache, "paged_kv_cache")
    k_sf, v_sf = _split_kv(kv_cache_sf, "kv_cache_sf")
    page_size = _as_nhd(k_cache, kv_layout).shape[1]

    rows, page, entry = resolve_targets(
        batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, k_cache.shape[0], page_size
    )
    key_side = (append_key, k_cache, k_sf, k_scale)
    value_side = (append_value, v_cache, v_sf, v_scale)
    for append, cache, sf_cache, scale in (key_side, value_side):
        packed, scales = quantize(append[rows], scale)  # [n, heads, head_dim/2], [n, heads, head_dim/16]
        # Assigning through views writes into the caller's storage (also for halves of a stacked cache). The scale
        # cache is written as uint8 because index_put_ does not support float8.
        _as_nhd(cache, kv_layout)[page, entry] = packed
        _as_nhd(sf_cache.view(torch.uint8), kv_layout)[page, entry] = scales.view(torch.uint8)


def nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
    append_key: Tensor,
    append_value: Tensor,
    slot_mapping: Tensor,
    paged_kv_cache: KVCache,
    kv_cache_sf: KVCache,
    k_scale: float,
    v_scale: float,
    kv_layout: str = "NHD",
) -> None:
    """The slot-mapping variant, expressed through the page-table one: one request owning every page
    in order (kv_indices = 0..P-1) makes position == slot, so page = slot // page_size and
    entry = slot % page_size; negative slots and slots past the cache are skipped by its bounds rules.
    Only the first slot_mapping.numel() rows are appended."""
    k_cache = paged_kv_cache if isinstance(paged_kv_cache, Tensor) else paged_kv_cache[0]
    num_pages = k_cache.shape[0]
    device = slot_mapping.device
    n = slot_mapping.numel()
    nvfp4_quantize_append_paged_kv_cache(
        append_key[:n], append_value[:n], torch.zeros(n, dtype=torch.int64, device=device), slot_mapping.long(),
        paged_kv_cache, kv_cache_sf, torch.arange(num_pages, device=device),
        torch.tensor([0, num_pages], device=device), torch.ones(1, dtype=torch.int64, device=device),
        k_scale, v_scale, kv_layout)
