"""Random MLA latent append cases (docs/SPEC.md section 4), on the page tables of tests/append_cases.py.

Caches start filled with random bytes (the poison), so comparing whole caches after a call proves exactly
which bytes were written. Cases move between devices with MlaCase.to, which keeps views of one storage
views of one storage (a projection's ckv/kpe halves, a pool's column slices).
"""

from __future__ import annotations

import dataclasses

import torch

from append_cases import _move, cache_bytes, make_append_case


@dataclasses.dataclass
class MlaCase:
    append_ckv: torch.Tensor
    append_kpe: torch.Tensor
    batch_indices: torch.Tensor
    positions: torch.Tensor
    ckv_cache: torch.Tensor
    ckv_sf_cache: torch.Tensor
    kpe_cache: torch.Tensor
    kv_indices: torch.Tensor
    kv_indptr: torch.Tensor
    kv_last_page_len: torch.Tensor
    ckv_scale: float
    kpe_scale: float

    def args(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def caches(self) -> tuple:
        return self.ckv_cache, self.ckv_sf_cache, self.kpe_cache

    def slot_mapping(self) -> torch.Tensor:
        """The flat slots (page * page_size + entry) of this case's rows, for the slot-mapping variant."""
        page_size = self.ckv_cache.shape[1]
        indptr, indices = self.kv_indptr.long(), self.kv_indices.long()
        b, p = self.batch_indices.long(), self.positions.long()
        return (indices[indptr[b] + p // page_size] * page_size + p % page_size).to(self.batch_indices.dtype)

    def to(self, device) -> "MlaCase":
        storages = {}
        return MlaCase(**{f.name: _move(getattr(self, f.name), device, storages) for f in dataclasses.fields(self)})

    def cloned(self) -> "MlaCase":
        """The same case with deep copies of the caches (same geometry, one storage kept one storage)."""
        storages = {}
        device = self.ckv_cache.device
        moved = {
            name: _move(getattr(self, name), device, storages) for name in ("ckv_cache", "ckv_sf_cache", "kpe_cache")
        }
        return dataclasses.replace(self, **moved)

    def cache_bytes(self) -> torch.Tensor:
        return cache_bytes(self.caches())


def make_mla_case(
    *,
    ckv_dim: int = 512,
    kpe_dim: int = 64,
    page_size: int = 16,
    batch_size: int = 3,
    max_tokens: int = 40,
    decode: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    index_dtype: torch.dtype = torch.int32,
    projection: bool = False,
    pool: bool = False,
    kpe_cache_dtype: torch.dtype = torch.float8_e4m3fn,
    seed: int = 0,
) -> MlaCase:
    """A random CPU case. projection: ckv/kpe are the two halves of one [nnz, C + R] tensor. pool: the three
    caches are column slices of one [pages, page_size, bytes] uint8 pool (with padding bytes between)."""
    table = make_append_case(num_heads=1, head_dim=16, page_size=page_size, batch_size=batch_size,
                             max_tokens=max_tokens, decode=decode, index_dtype=index_dtype, seed=seed)  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)
    nnz = table.batch_indices.numel()
    num_pages = table.paged_kv_cache[0].shape[0]
    # Gaussian rows with a few outlier channels (RoPE channels several times larger) and some exact zeros.
    x = torch.randn(nnz, ckv_dim + kpe_dim, generator=g)
    x[:, torch.randint(0, ckv_dim, (ckv_dim // 32,), generator=g)] *= 20.0
    x[:, ckv_dim:] *= 4.0
    x[torch.rand(x.shape, generator=g) < 0.02] = 0.0
    if projection:
        both = x.to(dtype)
        ckv, kpe = both[:, :ckv_dim], both[:, ckv_dim:]
    else:
        ckv, kpe = x[:, :ckv_dim].to(dtype).contiguous(), x[:, ckv_dim:].to(dtype).contiguous()
    kpe_item = torch.empty(0, dtype=kpe_cache_dtype).element_size()
    widths = (ckv_dim // 2, ckv_dim // 16, kpe_dim * kpe_item)
    if pool:
        pad = 16
        offsets = [0, widths[0] + pad, widths[0] + widths[1] + 2 * pad]
        row = offsets[2] + widths[2] + pad
        storage = torch.randint(0, 256, (num_pages, page_size, row), dtype=torch.uint8, generator=g)
        parts = [storage[..., o : o + w] for o, w in zip(offsets, widths)]
    else:
        parts = [torch.randint(0, 256, (num_pages, page_size, w), dtype=torch.uint8, generator=g) for w in widths]
    ckv_amax = float(ckv.float().abs().max()) if nnz else 1.0
    kpe_amax = float(kpe.float().abs().max()) if nnz else 1.0
    return MlaCase(
        append_ckv=ckv,
        append_kpe=kpe,
        batch_indices=table.batch_indices,
        positions=table.positions,
        ckv_cache=parts[0],
        ckv_sf_cache=parts[1].view(torch.float8_e4m3fn),
        kpe_cache=parts[2].view(kpe_cache_dtype),
        kv_indices=table.kv_indices,
        kv_indptr=table.kv_indptr,
        kv_last_page_len=table.kv_last_page_len,
        ckv_scale=ckv_amax / (6 * 448) * float(torch.empty(1).uniform_(0.5, 2.0, generator=g)),
        kpe_scale=kpe_amax / 448 * float(torch.empty(1).uniform_(0.5, 2.0, generator=g)),
    )
