"""One input generator for every device: random paged-cache append cases.

A case is a set of requests with random lengths whose pages are scattered over a larger cache;
the appended rows are the last tokens of each request (prefill chunks or single decode tokens).
Caches start filled with random bytes (the poison), so comparing whole caches after a call proves
exactly which bytes were written.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

import torch

Cache = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass
class AppendCase:
    append_key: torch.Tensor
    append_value: torch.Tensor
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

    def args(self) -> tuple:
        return (
            self.append_key,
            self.append_value,
            self.batch_indices,
            self.positions,
            self.paged_kv_cache,
            self.kv_cache_sf,
            self.kv_indices,
            self.kv_indptr,
            self.kv_last_page_len,
            self.k_scale,
            self.v_scale,
            self.kv_layout,
        )

    def op_args(self) -> tuple:
        """The arguments of torch.ops.nvfp4kv.append_paged_kv_cache (a stacked cache whole, with None for V)."""
        k, v = (self.paged_kv_cache, None) if isinstance(self.paged_kv_cache, torch.Tensor) else self.paged_kv_cache
        k_sf, v_sf = (self.kv_cache_sf, None) if isinstance(self.kv_cache_sf, torch.Tensor) else self.kv_cache_sf
        return (self.append_key, self.append_value, self.batch_indices, self.positions, k, v, k_sf, v_sf,
                self.kv_indices, self.kv_indptr, self.kv_last_page_len, self.k_scale, self.v_scale,
                self.kv_layout)  # fmt: skip

    def with_caches(self, paged_kv_cache: Cache, kv_cache_sf: Cache) -> "AppendCase":
        return dataclasses.replace(self, paged_kv_cache=paged_kv_cache, kv_cache_sf=kv_cache_sf)

    def cloned(self) -> "AppendCase":
        """The same case with caches that are deep copies (same strides, same poison)."""
        return self.with_caches(clone_cache(self.paged_kv_cache), clone_cache(self.kv_cache_sf))

    def to(self, device) -> "AppendCase":
        storages = {}  # shared by every field: tensors sharing a storage keep sharing one
        moved = {f.name: _move(getattr(self, f.name), device, storages) for f in dataclasses.fields(self)}
        return AppendCase(**moved)


def _move(value, device, storages=None):
    """Tensors (and tuple caches) copied to `device` with the same storage layout and view geometry;
    tensors of one storage (in `storages`, keyed by the source storage) stay views of one storage."""
    storages = {} if storages is None else storages
    if isinstance(value, tuple):
        return tuple(_move(v, device, storages) for v in value)
    if isinstance(value, torch.Tensor):
        key = value.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = _copy_storage(value, device)
        if (key, value.dtype) not in storages:  # one dtype view per storage: views of one dtype share a _base
            storages[key, value.dtype] = _dtype_view(storages[key], value.dtype)
        return _view_of(storages[key, value.dtype], storages[key], value, device)
    return value


def _copy_storage(t: torch.Tensor, device) -> torch.Tensor:
    """Every byte of t's storage, as a flat uint8 tensor on `device`."""
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    return raw.to(device, copy=True)


def _dtype_view(flat: torch.Tensor, dtype: torch.dtype):
    """flat's bytes as `dtype` elements, or None when they do not divide into them."""
    element_size = torch.empty(0, dtype=dtype).element_size()
    return flat if dtype == torch.uint8 else flat.view(dtype) if flat.numel() % element_size == 0 else None


def _view_of(typed, flat: torch.Tensor, like: torch.Tensor, device) -> torch.Tensor:
    """`like`'s view geometry over the bytes of `flat`: an ordinary view (as_strided of the storage's one
    view as like's dtype, `typed`), as user code makes them; set_ only when there is no such view."""
    if typed is not None:
        return typed.as_strided(like.shape, like.stride(), like.storage_offset())
    return torch.empty(0, dtype=like.dtype, device=device).set_(
        flat.untyped_storage(), like.storage_offset(), like.shape, like.stride()
    )


def clone_cache(cache: Cache) -> Cache:
    return _move(cache, cache.device if isinstance(cache, torch.Tensor) else cache[0].device)


def cache_bytes(cache: Cache) -> torch.Tensor:
    """Every byte of the storage behind a cache (views included), as uint8 on the CPU."""
    tensors = [cache] if isinstance(cache, torch.Tensor) else list(cache)
    seen, parts = set(), []
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        parts.append(torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage).cpu())
    return torch.cat(parts)


def _random_bytes(shape, generator) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)


def _make_cache(
    num_pages: int,
    page_size: int,
    num_heads: int,
    width: int,
    layout: str,
    stacked: bool,
    strided: bool,
    dtype: torch.dtype,
    generator,
) -> Cache:
    inner = [page_size, num_heads] if layout == "NHD" else [num_heads, page_size]
    # Strided views: pad the head/entry dims and the last dim, then slice the padding away.
    pad_inner = [d + 1 for d in inner] if strided else inner
    pad_width = width + 8 if strided else width
    full = _random_bytes([num_pages, 2, *pad_inner, pad_width], generator).view(dtype)
    view = full[:, :, : inner[0], : inner[1], :width]
    if stacked:
        return view
    return view[:, 0], view[:, 1]


def make_append_case(
    *,
    num_heads: int = 4,
    head_dim: int = 64,
    page_size: int = 16,
    batch_size: int = 3,
    max_tokens: int = 40,
    decode: bool = False,
    layout: str = "NHD",
    stacked: bool = False,
    strided_cache: bool = False,
    strided_input: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    index_dtype: torch.dtype = torch.int32,
    seed: int = 0,
    extra_pages: int = 5,
    global_scale: Optional[float] = None,
) -> AppendCase:
    """A random CPU case; move it to another device with AppendCase.to (same bytes everywhere)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, max_tokens + 1, (batch_size,), generator=g)
    appended = (
        torch.ones_like(seq_lens)
        if decode
        else torch.minimum(seq_lens, torch.randint(1, max_tokens + 1, (batch_size,), generator=g))
    )
    pages_per_request = (seq_lens + page_size - 1) // page_size
    num_pages = int(pages_per_request.sum()) + extra_pages
    page_ids = torch.randperm(num_pages, generator=g)[: int(pages_per_request.sum())]
    kv_indptr = torch.zeros(batch_size + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(pages_per_request, 0)
    kv_last_page_len = seq_lens - (pages_per_request - 1) * page_size

    batch_indices = torch.repeat_interleave(torch.arange(batch_size), appended)
    starts = seq_lens - appended
    offsets = torch.arange(int(appended.sum())) - torch.repeat_interleave(
        torch.cumsum(appended, 0) - appended, appended
    )
    positions = starts[batch_indices] + offsets
    nnz = int(batch_indices.numel())

    # Gaussian rows with a few outlier channels and some exact zeros, in the input dtype.
    def rows():
        x = torch.randn(nnz, num_heads, head_dim, generator=g)
        x[..., torch.randint(0, head_dim, (max(1, head_dim // 16),), generator=g)] *= 30.0
        x[torch.rand(x.shape, generator=g) < 0.02] = 0.0
        return x

    if strided_input:
        kv = torch.stack([rows(), rows()], dim=1).to(dtype)  # [nnz, 2, H, D]: key = kv[:, 0]
        key, value = kv[:, 0], kv[:, 1]
    else:
        key, value = rows().to(dtype), rows().to(dtype)

    def scale_for(x: torch.Tensor) -> float:
        if global_scale is not None:
            return global_scale
        amax = float(x.float().abs().max()) if x.numel() else 1.0
        return amax / (6 * 448) * float(torch.empty(1).uniform_(0.25, 4.0, generator=g))

    to_index = lambda t: t.to(index_dtype)  # noqa: E731
    return AppendCase(
        append_key=key,
        append_value=value,
        batch_indices=to_index(batch_indices),
        positions=to_index(positions),
        paged_kv_cache=_make_cache(
            num_pages, page_size, num_heads, head_dim // 2, layout, stacked, strided_cache, torch.uint8, g
        ),
        kv_cache_sf=_make_cache(
            num_pages, page_size, num_heads, head_dim // 16, layout, stacked, strided_cache, torch.float8_e4m3fn, g
        ),
        kv_indices=to_index(page_ids),
        kv_indptr=to_index(kv_indptr),
        kv_last_page_len=to_index(kv_last_page_len),
        k_scale=scale_for(key),
        v_scale=scale_for(value),
        kv_layout=layout,
    )
