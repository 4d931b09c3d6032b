"""Pure-PyTorch reference of the NVFP4 KV-cache writer (SPEC.md sections 1 and 2).

This module is the test oracle: it is written for exactness and readability, not speed, and depends on torch only
(it never loads the compiled library). Every floating-point step is an IEEE float32 tensor operation in the order
the spec gives, so its bytes are the bytes the CPU and CUDA kernels must produce.

Beyond SPEC sections 1-3 it implements two extensions of docs/SPEC.md, keyword-only on the append functions:
- scale_search="4over6": per block, the scale of SPEC section 2 (sf6) competes with sf4 = E4M3(a / (4.0f * s)); the
  one with the smaller fp32 squared error wins, ties keep sf6 (see quantize).
- v_sf_layout="trtllm": V scales stored in the 4-token interleaved layout of FlashInfer's trtllm-gen kernels, built
  here by reshape/permute of each (page, head) tile (see v_scales_linear_to_trtllm), never by an offset formula.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "quantize",
    "dequantize",
    "nvfp4_quantize_append_paged_kv_cache",
    "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping",
    "resolve_targets",
    "v_scales_linear_to_trtllm",
    "v_scales_trtllm_to_linear",
    "round_to_e4m3_code",
    "round_to_e2m1_code",
]

BLOCK_SIZE = 16
E4M3_MAX_CODE = 0x7E  # 448.0, the largest finite float8_e4m3fn
E4M3_NAN_CODE = 0x7F
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # indexed by the low 3 bits of a code
E2M1_SIGN_BIT = 0x8

KVCache = Union[Tensor, Tuple[Tensor, Tensor]]
SCALE_SEARCHES = ("none", "4over6")
V_SF_LAYOUTS = ("linear", "trtllm")
TRTLLM_TOKEN_GROUP = 4  # tokens interleaved per scale column in the "trtllm" V-scale layout


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


def _block_scale_codes(a: Tensor, multiplier: float, s: Tensor) -> Tensor:
    """E4M3 codes (uint8) of a / (multiplier * s), the product rounded to fp32 first (SPEC section 2 steps 3-4)."""
    return round_to_e4m3_code(a / (_fp32(multiplier) * s))


def _block_codes(blocks: Tensor, a: Tensor, scale_code: Tensor, s: Tensor) -> Tensor:
    """E2M1 codes (uint8, [..., 16]) of blocks quantized with the given scale codes, SPEC section 2 steps 5-6."""
    sf = scale_code.view(torch.float8_e4m3fn).to(torch.float32)  # exact decode
    r = torch.where((a == 0) | (sf == 0), 0.0, 1.0 / (sf * s))
    y = blocks * r.unsqueeze(-1)
    # The sign bit is signbit(x). It equals signbit(y) except when y is NaN (x == +-0 times r == inf, only for absurdly
    # small s), where signbit(NaN) would be arbitrary; tests/test_reference.py: test_tiny_global_scale_makes_r_infinite.
    sign = torch.signbit(blocks).to(torch.uint8) * E2M1_SIGN_BIT
    return sign | round_to_e2m1_code(y.abs())


def _e2m1_values(codes: Tensor) -> Tensor:
    """float32 values of 4-bit E2M1 codes (bit 3 the sign, so code 0x8 is -0.0)."""
    magnitude = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=codes.device)[(codes & 0x7).long()]
    return torch.where((codes & E2M1_SIGN_BIT) != 0, -magnitude, magnitude)


def _squared_errors(blocks: Tensor, codes: Tensor, scale_code: Tensor, s: Tensor) -> Tensor:
    """float32 [...] squared error of each block, bit-exact as docs/SPEC.md defines it for 4-over-6.

    d = (e2m1(code) * float(sf)) * s - x with every product and the difference rounded to fp32, then
    acc = acc + d * d in element order 0..15. Each step is its own float32 tensor op, so nothing is fused into a
    multiply-add and the order is fixed; only the loop over blocks is vectorized.
    """
    values = _e2m1_values(codes)
    sf = scale_code.view(torch.float8_e4m3fn).to(torch.float32)
    acc = torch.zeros(blocks.shape[:-1], dtype=torch.float32, device=blocks.device)
    for j in range(BLOCK_SIZE):
        product = values[..., j] * sf
        dequantized = product * s
        d = dequantized - blocks[..., j]
        square = d * d
        acc = acc + square
    return acc


def quantize(x: Tensor, global_scale: float, scale_search: str = "none") -> Tuple[Tensor, Tensor]:
    """NVFP4-quantize x ([..., D], fp16/bf16/fp32, D % 16 == 0) with the global decode scale.

    Returns (packed uint8 [..., D/2], block scales float8_e4m3fn [..., D/16]), bit-exact to SPEC section 2.

    scale_search="4over6" (docs/SPEC.md): besides sf6 = E4M3(a / (6.0f * s)) each block forms sf4 = E4M3(a / (4.0f * s))
    (same rounding and saturation), quantizes itself with both exactly as SPEC steps 5-7, and keeps sf4 only when its
    squared error (_squared_errors) is strictly smaller. Ties, and so all-zero blocks, keep sf6. The comparison is
    the IEEE `err4 < err6`: a NaN error (inf - inf when e2m1 * sf * s overflows on an infinite input) never picks
    sf4, and two infinite errors tie. The NaN rule of SPEC step 1 still overrides everything.
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must have dtype float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(f"x must have a last dimension that is a multiple of {BLOCK_SIZE}, got shape {tuple(x.shape)}")
    if scale_search not in SCALE_SEARCHES:
        raise ValueError(f"scale_search must be one of {SCALE_SEARCHES}, got {scale_search!r}")

    blocks = x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    s = _fp32(global_scale)
    has_nan = torch.isnan(blocks).any(dim=-1)

    a = blocks.abs().amax(dim=-1)  # may be +inf; NaN blocks are overwritten below
    scale_code = _block_scale_codes(a, 6.0, s)
    codes = _block_codes(blocks, a, scale_code, s)

    if scale_search == "4over6":
        scale_code_4 = _block_scale_codes(a, 4.0, s)
        codes_4 = _block_codes(blocks, a, scale_code_4, s)
        use_4 = _squared_errors(blocks, codes_4, scale_code_4, s) < _squared_errors(blocks, codes, scale_code, s)
        scale_code = torch.where(use_4, scale_code_4, scale_code)
        codes = torch.where(use_4.unsqueeze(-1), codes_4, codes)

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
    e2m1 = _e2m1_values(_unpack_nibbles(packed))
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


def _trtllm_tile_shape(v_sf: Tensor, kv_layout: str) -> Tuple[int, int]:
    """(page_size, head_dim / 16) of a 4-D V-scale cache, checked for the "trtllm" layout's requirements."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    if v_sf.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"v_sf must have dtype float8_e4m3fn or uint8, got {v_sf.dtype}")
    if v_sf.dim() != 4:
        raise ValueError(f"v_sf must be a 4-D [pages, ...] scale cache, got shape {tuple(v_sf.shape)}")
    page_size = _as_nhd(v_sf, kv_layout).shape[1]
    blocks = v_sf.shape[3]
    if page_size % TRTLLM_TOKEN_GROUP != 0:
        raise ValueError(
            f"the 'trtllm' V-scale layout needs page_size to be a multiple of {TRTLLM_TOKEN_GROUP}, got {page_size}"
        )
    if blocks % TRTLLM_TOKEN_GROUP != 0:
        raise ValueError(
            f"the 'trtllm' V-scale layout needs head_dim to be a multiple of {TRTLLM_TOKEN_GROUP * BLOCK_SIZE} "
            f"(head_dim/16 scales per row a multiple of {TRTLLM_TOKEN_GROUP}), got head_dim {blocks * BLOCK_SIZE}"
        )
    return page_size, blocks


def _permute_v_scale_tiles(v_sf: Tensor, kv_layout: str, to_trtllm: bool) -> Tensor:
    """A new tensor (same shape, dtype and layout as v_sf, contiguous) with every (page, head) tile permuted.

    Each tile is the T x S block of scales of one page and one kv-head, a flat sequence of T*S bytes in token-major
    order. "linear" reads it as [T, S]; "trtllm" as [T/4, S, 4], indexed [t // 4][j][t % 4]. Converting is a
    reshape to [T/4, 4, S] and a swap of the last two axes (its own inverse with the roles exchanged).
    HND tiles are the contiguous [T, S] of v_sf[page, head]. An NHD cache holds the same flat tile sequence at NHD
    coordinates (flat index f -> [page, f // S, head, f % S]), so it is converted as its HND transpose and
    transposed back: NHD "trtllm" == (HND "trtllm").transpose(-3, -2).
    """
    page_size, blocks = _trtllm_tile_shape(v_sf, kv_layout)
    hnd = v_sf.view(torch.uint8) if kv_layout == "HND" else v_sf.view(torch.uint8).transpose(1, 2)
    pages, heads = hnd.shape[0], hnd.shape[1]
    linear_shape = (pages, heads, page_size // TRTLLM_TOKEN_GROUP, TRTLLM_TOKEN_GROUP, blocks)
    trtllm_shape = (pages, heads, page_size // TRTLLM_TOKEN_GROUP, blocks, TRTLLM_TOKEN_GROUP)
    source_shape, target_shape = (linear_shape, trtllm_shape) if to_trtllm else (trtllm_shape, linear_shape)

    converted = torch.empty(target_shape, dtype=torch.uint8, device=v_sf.device)
    converted.copy_(hnd.reshape(source_shape).transpose(-1, -2))
    converted = converted.view(pages, heads, page_size, blocks)
    if kv_layout == "NHD":
        converted = converted.transpose(1, 2).contiguous()
    return converted.view(v_sf.dtype)


def v_scales_linear_to_trtllm(v_sf: Tensor, kv_layout: str) -> Tensor:
    """A V-scale cache ([pages, T, H, S] NHD or [pages, H, T, S] HND, float8_e4m3fn or uint8) converted from the
    linear layout to FlashInfer trtllm-gen's 4-token interleaved layout; returns a new tensor.

    Inside each (page, head) tile the scale of (token t, block j) moves from flat index t*S + j to
    4*S*(t // 4) + 4*j + (t % 4). Needs page_size % 4 == 0 and head_dim % 64 == 0 (ValueError otherwise).
    """
    return _permute_v_scale_tiles(v_sf, kv_layout, to_trtllm=True)


def v_scales_trtllm_to_linear(v_sf: Tensor, kv_layout: str) -> Tensor:
    """The exact inverse of v_scales_linear_to_trtllm; returns a new tensor."""
    return _permute_v_scale_tiles(v_sf, kv_layout, to_trtllm=False)


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
    *,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> None:
    """Quantize K/V rows and write them into the paged NVFP4 cache in place (SPEC section 1).

    append_key/append_value: [nnz, heads, head_dim]. Caches: NHD [pages, page_size, heads, head_dim/2] (scales
    head_dim/16), HND [pages, heads, page_size, ...]; as a (k, v) tuple or stacked on dim 1. Rows whose indices fall
    outside the cache are skipped (see resolve_targets); nothing but the target bytes changes.

    scale_search ("none" | "4over6") picks the block-scale recipe of K and V (see quantize). v_sf_layout
    ("linear" | "trtllm") is the layout of the V scales only; K scales and packed data are always linear. A "trtllm"
    V-scale cache is converted to linear, appended to, and converted back, so the bytes written are exactly those of
    a linear append followed by v_scales_linear_to_trtllm, and every other byte keeps its prior value.
    """
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    if v_sf_layout not in V_SF_LAYOUTS:
        raise ValueError(f"v_sf_layout must be one of {V_SF_LAYOUTS}, got {v_sf_layout!r}")
    if scale_search not in SCALE_SEARCHES:
        raise ValueError(f"scale_search must be one of {SCALE_SEARCHES}, got {scale_search!r}")
    k_cache, v_cache = _split_kv(paged_kv_cache, "paged_kv_cache")
    k_sf, v_sf = _split_kv(kv_cache_sf, "kv_cache_sf")
    page_size = _as_nhd(k_cache, kv_layout).shape[1]
    # Checked (and converted) before anything is written.
    v_sf_linear = v_scales_trtllm_to_linear(v_sf, kv_layout) if v_sf_layout == "trtllm" else v_sf

    rows, page, entry = resolve_targets(
        batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, k_cache.shape[0], page_size
    )
    key_side = (append_key, k_cache, k_sf, k_scale)
    value_side = (append_value, v_cache, v_sf_linear, v_scale)
    for append, cache, sf_cache, scale in (key_side, value_side):
        # [n, heads, head_dim/2], [n, heads, head_dim/16]
        packed, scales = quantize(append[rows], scale, scale_search=scale_search)
        # Assigning through views writes into the caller's storage (also for halves of a stacked cache). The scale
        # cache is written as uint8 because index_put_ does not support float8.
        _as_nhd(cache, kv_layout)[page, entry] = packed
        _as_nhd(sf_cache.view(torch.uint8), kv_layout)[page, entry] = scales.view(torch.uint8)
    if v_sf_layout == "trtllm":
        v_sf.view(torch.uint8).copy_(v_scales_linear_to_trtllm(v_sf_linear, kv_layout).view(torch.uint8))


def nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
    append_key: Tensor,
    append_value: Tensor,
    slot_mapping: Tensor,
    paged_kv_cache: KVCache,
    kv_cache_sf: KVCache,
    k_scale: float,
    v_scale: float,
    kv_layout: str = "NHD",
    *,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
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
        append_key[:n],
        append_value[:n],
        torch.zeros(n, dtype=torch.int64, device=device),
        slot_mapping.long(),
        paged_kv_cache,
        kv_cache_sf,
        torch.arange(num_pages, device=device),
        torch.tensor([0, num_pages], device=device),
        torch.ones(1, dtype=torch.int64, device=device),
        k_scale,
        v_scale,
        kv_layout,
        v_sf_layout=v_sf_layout,
        scale_search=scale_search,
    )
