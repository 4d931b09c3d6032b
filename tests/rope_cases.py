"""Random cases of the fused RoPE + NVFP4 append (docs/SPEC.md section 5), on the page tables of
tests/append_cases.py, and the pairwise grid their parameters are sampled from.

A case has n = nnz + padding rows: rows i < nnz are placed by the page table (or by its flat slots, one of them
padding), the rest are only rotated. Some rope positions fall outside the cos/sin table (negative, == max_pos),
caches start filled with random bytes (the poison), and q/k/v may be views of one packed qkv projection output.
Cases move between devices with RopeCase.to, which keeps views of one storage views of one storage.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from typing import Dict, List, Optional, Sequence

import torch

from append_cases import Cache, _move, make_append_case

# Q values (multiplied by the case's q_scale, a power of two, so each division is exact) that hit the E4M3
# rounding edges of FP8 Q: ties to even, 448 and its saturating neighbours, infinities, NaN, signed zero, subnormals.
Q_EDGE_VALUES = (1.0625, 1.1875, 448.0, 464.0, 1000.0, math.inf, -math.inf, math.nan, 2.0**-10, 3 * 2.0**-10,
                 5 * 2.0**-10, -0.0, 2.25, 480.0, -464.0, 0.0)  # fmt: skip
# The same without the NaN (a negative tie in its place): FP8 Q units without a NaN take their own path. A head holds
# them in its first half and reversed in its second, so that each infinity's NeoX and GPT-J partners are finite.
Q_FINITE_EDGE_VALUES = tuple(-1.0625 if math.isnan(v) else v for v in Q_EDGE_VALUES)


@dataclasses.dataclass
class RopeCase:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    cos_sin_cache: torch.Tensor
    rope_positions: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor
    paged_kv_cache: Cache
    kv_cache_sf: Cache
    kv_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    k_scale: float
    v_scale: float
    kv_layout: str
    slot_mapping: torch.Tensor  # [nnz]: the page table's targets as flat slots, some padding (-1)
    is_neox: bool
    q_scale: float  # the decode scale of FP8 Q

    def args(self) -> tuple:
        """The positional arguments of rope_quantize_nvfp4_append_paged_kv_cache."""
        return (self.query, self.key, self.value, self.cos_sin_cache, self.rope_positions, self.batch_indices,
                self.positions, self.paged_kv_cache, self.kv_cache_sf, self.kv_indices, self.kv_indptr,
                self.kv_last_page_len, self.k_scale, self.v_scale, self.kv_layout)  # fmt: skip

    def slot_args(self) -> tuple:
        """The positional arguments of rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping."""
        return (self.query, self.key, self.value, self.cos_sin_cache, self.rope_positions, self.slot_mapping,
                self.paged_kv_cache, self.kv_cache_sf, self.k_scale, self.v_scale, self.kv_layout)  # fmt: skip

    def inputs(self) -> tuple:
        return self.query, self.key, self.value

    def to(self, device) -> "RopeCase":
        storages = {}  # shared by every field: tensors sharing a storage keep sharing one
        return RopeCase(**{f.name: _move(getattr(self, f.name), device, storages) for f in dataclasses.fields(self)})

    def cloned(self) -> "RopeCase":
        """Deep copies of every tensor (caches and inputs, which in-place Q out writes), same geometry."""
        return self.to(self.query.device)


def cos_sin_table(max_pos: int, rotary_dim: int, dtype: torch.dtype, theta: float = 10000.0) -> torch.Tensor:
    """[max_pos, rotary_dim]: cos(p * f_j) | sin(p * f_j) with f_j = theta ** (-2j / rotary_dim), from float64."""
    inv_freq = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def make_rope_case(
    *,
    num_qo_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    rotary_dim: Optional[int] = None,
    page_size: int = 16,
    batch_size: int = 3,
    max_tokens: int = 20,
    decode: bool = False,
    layout: str = "NHD",
    stacked: bool = False,
    strided_cache: bool = False,
    packed: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    index_dtype: torch.dtype = torch.int32,
    rope_index_dtype: torch.dtype = torch.int64,
    table_dtype: torch.dtype = torch.float32,
    is_neox: bool = True,
    padding_rows: int = 3,
    invalid_positions: bool = True,
    special_values: bool = False,
    seed: int = 0,
) -> RopeCase:
    """A random CPU case; move it to another device with RopeCase.to (same bytes everywhere).

    packed: query/key/value are the [:, :Hq], [:, Hq:Hq+Hkv] and [:, Hq+Hkv:] views of one [n, Hq+2Hkv, D] tensor.
    invalid_positions: rope positions -1 (row 0), max_pos (a middle row < nnz) and -max_pos - 3 (the last row).
    special_values: Q_EDGE_VALUES * q_scale in the Q of padding row n - 2 at rope position 0 (cos 1, sin 0: the
    rotation keeps each value whose partner is finite; Q_FINITE_EDGE_VALUES in its odd heads) and in the dims >= R of
    padding row n - 3, where Q head 0 also holds infinities that rotate to a NaN in one member of a NeoX pair only;
    a NaN in a K row and an infinity in a V row.
    """
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    table = make_append_case(num_heads=num_kv_heads, head_dim=head_dim, page_size=page_size, batch_size=batch_size,
                             max_tokens=max_tokens, decode=decode, layout=layout, stacked=stacked,
                             strided_cache=strided_cache, dtype=dtype, index_dtype=index_dtype, seed=seed)  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)
    nnz = table.batch_indices.numel()
    n = nnz + padding_rows
    heads = num_qo_heads + 2 * num_kv_heads

    x = torch.randn(n, heads, head_dim, generator=g)
    x[..., torch.randint(0, head_dim, (max(1, head_dim // 16),), generator=g)] *= 30.0
    x[torch.rand(x.shape, generator=g) < 0.02] = 0.0

    max_pos = int(table.positions.max()) + 5
    cos_sin_cache = cos_sin_table(max_pos, rotary_dim, table_dtype)
    rope_positions = torch.randint(0, max_pos, (n,), generator=g)
    rope_positions[:nnz] = table.positions.long()  # the usual case: the rope position is the cache position
    q_scale = 0.5
    if special_values:
        edges = torch.tensor(Q_EDGE_VALUES) * q_scale
        row = n - 2
        rope_positions[row] = 0
        x[row, :num_qo_heads] = edges.repeat(head_dim // len(Q_EDGE_VALUES))
        finite, half = torch.tensor(Q_FINITE_EDGE_VALUES) * q_scale, head_dim // 2
        tiles = math.ceil((head_dim - half) / len(finite))  # enough for the larger half
        halves = [finite.repeat(tiles)[:half], finite.flip(0).repeat(tiles)[: head_dim - half]]
        x[row, 1:num_qo_heads:2] = torch.cat(halves)
        assert padding_rows >= 3, "special values go into the padding rows n - 2 and n - 3"
        rope_positions[n - 3] = max_pos - 1
        # Infinities that rotate to a NaN in one member of a NeoX pair (j, j + m) only (x c - y s = inf - inf while
        # y c + x s is infinite, or the reverse), in Q head 0 of row n - 3: pair 0 in its first member, pair 16 (the
        # next unit's first; pair m - 1 where m <= 16) in its second.
        m = rotary_dim // 2
        for j, nan_in_first in ((0, True), (16 if m > 16 else m - 1, False)):
            c, s = (float(v) for v in cos_sin_cache[max_pos - 1, [j, m + j]])
            assert c != 0 and s != 0, "the construction needs a nonzero cos and sin"
            same = math.copysign(1.0, c) * math.copysign(1.0, s)
            x[n - 3, 0, j], x[n - 3, 0, m + j] = math.inf, (same if nan_in_first else -same) * math.inf
        if rotary_dim < head_dim:
            tail = x[n - 3, :num_qo_heads, rotary_dim:]
            tail.copy_(edges.repeat(math.ceil(tail.shape[-1] / len(edges)))[: tail.shape[-1]])
        x[nnz - 1, num_qo_heads, 3] = math.nan  # a K row's NaN block (scale 0x7F)
        x[0 if nnz < 2 else 1, num_qo_heads + num_kv_heads - 1, head_dim - 1] = math.inf
    if invalid_positions:
        rope_positions[0] = -1
        rope_positions[nnz // 2] = max_pos
        rope_positions[n - 1] = -max_pos - 3

    x = x.to(dtype)
    if packed:
        query, key, value = x[:, :num_qo_heads], x[:, num_qo_heads:-num_kv_heads], x[:, -num_kv_heads:]
    else:
        query, key, value = (t.contiguous() for t in x.split([num_qo_heads, num_kv_heads, num_kv_heads], dim=1))

    def scale_for(t: torch.Tensor) -> float:
        finite = t.float()[t.float().isfinite()]
        amax = float(finite.abs().max()) if finite.numel() else 1.0
        return amax / (6 * 448) * float(torch.empty(1).uniform_(0.25, 4.0, generator=g))

    k_cache = table.paged_kv_cache if isinstance(table.paged_kv_cache, torch.Tensor) else table.paged_kv_cache[0]
    entry_dim = (1 if layout == "NHD" else 2) + (1 if k_cache.dim() == 5 else 0)
    indptr, indices = table.kv_indptr.long(), table.kv_indices.long()
    b, p = table.batch_indices.long(), table.positions.long()
    slots = indices[indptr[b] + p // page_size] * page_size + p % page_size
    assert k_cache.shape[entry_dim] == page_size
    slots[min(1, nnz - 1)] = -1  # a padding row

    return RopeCase(
        query=query,
        key=key,
        value=value,
        cos_sin_cache=cos_sin_cache,
        rope_positions=rope_positions.to(rope_index_dtype),
        batch_indices=table.batch_indices,
        positions=table.positions,
        paged_kv_cache=table.paged_kv_cache,
        kv_cache_sf=table.kv_cache_sf,
        kv_indices=table.kv_indices,
        kv_indptr=table.kv_indptr,
        kv_last_page_len=table.kv_last_page_len,
        k_scale=scale_for(key),
        v_scale=scale_for(value),
        kv_layout=layout,
        slot_mapping=slots.to(index_dtype),
        is_neox=is_neox,
        q_scale=q_scale,
    )


def pairwise(factors: Dict[str, Sequence], seed: int = 0, candidates: int = 50) -> List[dict]:
    """A list of parameter dicts in which every pair of values of every two factors occurs at least once (a
    deterministic greedy all-pairs cover: each row is the best of `candidates` random rows, each seeded with a pair
    not yet covered)."""
    names = list(factors)
    sizes = [len(factors[name]) for name in names]
    uncovered = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(names)), 2)
        for a in range(sizes[i])
        for b in range(sizes[j])
    }
    rng = random.Random(seed)
    rows = []
    while uncovered:
        best, best_pairs = None, set()
        for _ in range(candidates):
            i, a, j, b = rng.choice(sorted(uncovered))
            row = [rng.randrange(size) for size in sizes]
            row[i], row[j] = a, b
            pairs = {(p, row[p], q, row[q]) for p, q in itertools.combinations(range(len(names)), 2)} & uncovered
            if len(pairs) > len(best_pairs):
                best, best_pairs = row, pairs
        uncovered -= best_pairs
        rows.append({name: factors[name][index] for name, index in zip(names, best)})
    return rows
