"""Pure-PyTorch reference of the fused rotary embedding (RoPE) + NVFP4 append (SPEC.md section 5), the test oracle
of the fused ops.

Like nvfp4kv.reference and nvfp4kv.reference_mla (whose append, placement and E4M3 rounding it composes) it is
written for exactness, depends on torch only and never loads the compiled library. The rotation is a sequence of
IEEE float32 tensor operations in the spec's order, one product or one sum per operation (so nothing can be fused
into a multiply-add), and the fused op is expressed as the unfused pipeline `apply_rope -> append`.

Decisions beyond SPEC section 5 (the fused API's):
- A rotated value that is NaN is written as the quiet NaN 0x7E00 (fp16) / 0x7FC0 (bf16), whatever its float32 sign
  and payload: the spec only says NaN stays NaN, and CPU and GPU arithmetic give different NaN bits. Dims d >= R are
  copied as 16-bit patterns, so every NaN there (signalling ones too) keeps its bits.
- Every row i < n is rotated; rows i < nnz with a valid rope position are placed as the plain append places them,
  rows of an invalid position and rows i >= nnz are not appended.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .reference import (
    KVCache,
    nvfp4_quantize_append_paged_kv_cache,
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping,
)
from .reference_mla import quantize_kpe

__all__ = [
    "apply_rope",
    "quantize_q_fp8",
    "rope_quantize_nvfp4_append_paged_kv_cache",
    "rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping",
]

Scale = Union[float, Tensor]

INPUT_DTYPES = (torch.float16, torch.bfloat16)
TABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CANONICAL_NAN_BITS = {torch.float16: 0x7E00, torch.bfloat16: 0x7FC0}


def _pair_dims(m: int, is_neox: bool, device) -> Tuple[Tensor, Tensor]:
    """The dims (a, b) of the m rotated pairs: (j, j + m) for NeoX, (2j, 2j + 1) for GPT-J."""
    j = torch.arange(m, device=device)
    return (j, j + m) if is_neox else (2 * j, 2 * j + 1)


def _bits_of(rounded: Tensor) -> Tensor:
    """int16 patterns of a float16/bfloat16 tensor with every NaN replaced by the canonical quiet NaN."""
    canonical = torch.tensor(CANONICAL_NAN_BITS[rounded.dtype], dtype=torch.int16, device=rounded.device)
    return torch.where(torch.isnan(rounded), canonical, rounded.view(torch.int16))


def apply_rope(x: Tensor, cos_sin_cache: Tensor, rope_positions: Tensor, is_neox: bool = True) -> Tuple[Tensor, Tensor]:
    """Rotate the rows of x ([n, H, D], float16/bfloat16) by the cos/sin table rows of their rope positions.

    cos_sin_cache: [max_pos, R] float32/float16/bfloat16 (widened exactly to float32), R even and R <= D; row p holds
    cos in [0, R/2) and sin in [R/2, R). For each pair (a, b), x = X[a], y = X[b] (exact in float32):
    O[a] = (x * c) - (y * s), O[b] = (y * c) + (x * s), each product and each sum a float32 operation of its own,
    then rounded to x.dtype (nearest even, overflow -> inf, NaN -> the canonical quiet NaN). Dims d >= R are copied
    bit for bit. Rows whose position is outside [0, max_pos) are all +0.

    Returns (rotated [n, H, D] in x.dtype, contiguous; valid [n] bool: the rows whose position is in the table).
    """
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must have dtype float16 or bfloat16, got {x.dtype}")
    if cos_sin_cache.dtype not in TABLE_DTYPES:
        raise TypeError(f"cos_sin_cache must have dtype float32, float16 or bfloat16, got {cos_sin_cache.dtype}")
    if x.dim() != 3:
        raise ValueError(f"x must be [n, heads, head_dim], got shape {tuple(x.shape)}")
    if cos_sin_cache.dim() != 2:
        raise ValueError(f"cos_sin_cache must be [max_pos, rotary_dim], got shape {tuple(cos_sin_cache.shape)}")
    n, _, head_dim = x.shape
    max_pos, rotary_dim = cos_sin_cache.shape
    if rotary_dim % 2 != 0 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(f"cos_sin_cache must have an even rotary_dim in [2, head_dim={head_dim}], got {rotary_dim}")
    if rope_positions.dim() != 1 or rope_positions.numel() != n:
        raise ValueError(f"rope_positions must be [n={n}], got shape {tuple(rope_positions.shape)}")

    m = rotary_dim // 2
    p = rope_positions.long()
    valid = (p >= 0) & (p < max_pos)
    rows = cos_sin_cache.to(torch.float32) if max_pos else cos_sin_cache.new_zeros(1, rotary_dim, dtype=torch.float32)
    table = rows[torch.where(valid, p, 0)]  # [n, R], exact widening; rows outside the table read row 0 (zeroed below)
    c = table[:, None, :m]  # [n, 1, m]
    s = table[:, None, m:]
    a, b = _pair_dims(m, is_neox, x.device)
    xa = x[..., a].to(torch.float32)  # [n, H, m], exact
    xb = x[..., b].to(torch.float32)

    out_a = torch.sub(torch.mul(xa, c), torch.mul(xb, s))
    out_b = torch.add(torch.mul(xb, c), torch.mul(xa, s))

    bits = x.view(torch.int16).clone(memory_format=torch.contiguous_format)  # dims >= R keep their 16-bit patterns
    bits[..., a] = _bits_of(out_a.to(x.dtype))
    bits[..., b] = _bits_of(out_b.to(x.dtype))
    bits[~valid] = 0
    return bits.view(x.dtype), valid


def quantize_q_fp8(q16: Tensor, q_scale: Scale) -> Tensor:
    """float8_e4m3fn Q of q16 (float16/bfloat16): byte = E4M3(float(q16) / q_scale), one IEEE float32 division, the
    rounding of SPEC section 4's kpe (nvfp4kv.reference_mla.quantize_kpe): nearest even, saturating to +-448
    (+-inf too), the sign kept (-0.0 -> 0x80), NaN -> 0x7F. q_scale: a float (rounded to float32) or a
    one-element float32 tensor."""
    return quantize_kpe(q16, _float_scale(q_scale)).view(torch.float8_e4m3fn)


def _float_scale(scale: Scale) -> float:
    """A float or one-element tensor scale as a Python float (a float32 tensor's value is kept exactly)."""
    return float(scale.item()) if isinstance(scale, Tensor) else float(scale)


def _write_bits(out: Tensor, values: Tensor) -> None:
    """out[...] = values as bit patterns (same dtype and shape), so NaN bits survive any copy."""
    as_int = torch.uint8 if out.element_size() == 1 else torch.int16
    out.view(as_int).copy_(values.view(as_int))


def _rotate_q_and_k(query, key, cos_sin_cache, rope_positions, is_neox, q_out, q_out_dtype, q_scale, k_out):
    """(q result, rotated K, valid rows); q_out and k_out are written when given, after every input is read."""
    if key.dtype != query.dtype or key.shape[0] != query.shape[0]:
        raise ValueError(f"key must have query's dtype and row count, got {key.dtype} {tuple(key.shape)}")
    if q_out_dtype is None:
        q_out_dtype = q_out.dtype if q_out is not None else query.dtype
    if q_out_dtype not in (query.dtype, torch.float8_e4m3fn):
        raise TypeError(f"q_out_dtype must be {query.dtype} or torch.float8_e4m3fn, got {q_out_dtype}")
    fp8 = q_out_dtype == torch.float8_e4m3fn
    if fp8 != (q_scale is not None):
        raise ValueError("q_scale must be given exactly when Q out is float8_e4m3fn")
    q_rot, valid = apply_rope(query, cos_sin_cache, rope_positions, is_neox)
    k_rot, _ = apply_rope(key, cos_sin_cache, rope_positions, is_neox)
    q_result = quantize_q_fp8(q_rot, q_scale) if fp8 else q_rot
    if q_out is not None:
        if q_out.dtype != q_out_dtype or q_out.shape != query.shape:
            raise ValueError(
                f"q_out must be {q_out_dtype} {tuple(query.shape)}, got {q_out.dtype} {tuple(q_out.shape)}"
            )
        _write_bits(q_out, q_result)
        q_result = q_out
    if k_out is not None:
        _write_bits(k_out, k_rot)
    return q_result, k_rot, valid


def _appended_rows(valid: Tensor, nnz: int) -> Tensor:
    """Indices of the rows i < nnz whose rope position is in the table (int64)."""
    if nnz > valid.numel():
        raise ValueError(f"at most n={valid.numel()} rows can be placed, got {nnz}")
    return torch.nonzero(valid[:nnz]).flatten()


def rope_quantize_nvfp4_append_paged_kv_cache(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cos_sin_cache: Tensor,
    rope_positions: Tensor,
    batch_indices: Tensor,
    positions: Tensor,
    paged_kv_cache: KVCache,
    kv_cache_sf: KVCache,
    kv_indices: Tensor,
    kv_indptr: Tensor,
    kv_last_page_len: Tensor,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    *,
    is_neox: bool = True,
    q_out: Optional[Tensor] = None,
    q_out_dtype: Optional[torch.dtype] = None,
    q_scale: Optional[Scale] = None,
    k_out: Optional[Tensor] = None,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> Tensor:
    """Rotate Q and K of n rows, append the rotated K and the unrotated V of the rows i < nnz = batch_indices.numel()
    whose rope position is in the table (placement as nvfp4kv.reference.nvfp4_quantize_append_paged_kv_cache), and
    return Q out.

    query [n, Hq, D], key/value [n, Hkv, D] (float16/bfloat16). Q out is the rotated Q in query's dtype, or
    float8_e4m3fn bytes of it (quantize_q_fp8 with q_scale) when q_out_dtype (or q_out's dtype) says so; rows of an
    invalid position are zeros. q_out, when given, is written in place (it may be query itself) and returned;
    otherwise a new contiguous tensor is. k_out, when given, receives the rotated K of every row.
    """
    q_result, k_rot, valid = _rotate_q_and_k(
        query, key, cos_sin_cache, rope_positions, is_neox, q_out, q_out_dtype, q_scale, k_out
    )
    rows = _appended_rows(valid, batch_indices.numel())
    nvfp4_quantize_append_paged_kv_cache(
        k_rot[rows],
        value[rows],
        batch_indices[rows],
        positions[rows],
        paged_kv_cache,
        kv_cache_sf,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        _float_scale(k_scale),
        _float_scale(v_scale),
        kv_layout,
        v_sf_layout=v_sf_layout,
        scale_search=scale_search,
    )
    return q_result


def rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cos_sin_cache: Tensor,
    rope_positions: Tensor,
    slot_mapping: Tensor,
    paged_kv_cache: KVCache,
    kv_cache_sf: KVCache,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    *,
    is_neox: bool = True,
    q_out: Optional[Tensor] = None,
    q_out_dtype: Optional[torch.dtype] = None,
    q_scale: Optional[Scale] = None,
    k_out: Optional[Tensor] = None,
    v_sf_layout: str = "linear",
    scale_search: str = "none",
) -> Tensor:
    """The slot-mapping variant: rows i < nnz = slot_mapping.numel() with a valid rope position go to page
    slot // page_size, entry slot % page_size (negative slots and slots past the cache are skipped, as by
    nvfp4kv.reference.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping); rows i >= nnz are only rotated."""
    q_result, k_rot, valid = _rotate_q_and_k(
        query, key, cos_sin_cache, rope_positions, is_neox, q_out, q_out_dtype, q_scale, k_out
    )
    rows = _appended_rows(valid, slot_mapping.numel())
    nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(
        k_rot[rows],
        value[rows],
        slot_mapping[rows],
        paged_kv_cache,
        kv_cache_sf,
        _float_scale(k_scale),
        _float_scale(v_scale),
        kv_layout,
        v_sf_layout=v_sf_layout,
        scale_search=scale_search,
    )
    return q_result
