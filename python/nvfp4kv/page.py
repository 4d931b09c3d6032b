"""The FlashInfer-compatible paged-KV API (flashinfer.page.*): the appends (append.py) and the page-table
helpers: sequence lengths, batch indices and positions, readback, V-scale layout conversion."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .append import nvfp4_quantize_append_paged_kv_cache, nvfp4_quantize_append_paged_kv_cache_with_slot_mapping  # noqa: F401  (the FlashInfer module path nvfp4kv.page.*)
from .arguments import Cache, Scale, check_python_types, scale_argument, split_cache
from .mla import nvfp4_quantize_append_paged_mla_kv_cache, nvfp4_quantize_append_paged_mla_kv_cache_with_slot_mapping  # noqa: F401  (the FlashInfer module path nvfp4kv.page.*)
from .rope import rope_quantize_nvfp4_append_paged_kv_cache, rope_quantize_nvfp4_append_paged_kv_cache_with_slot_mapping  # noqa: F401

# The helpers check metadata (Python types, dtypes, shapes, devices) on the host; index values are
# device data, which they either handle safely whatever it holds or, where they synchronise anyway,
# validate on the host.

_INT32_MAX = 2**31 - 1


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_choice(op: str, name: str, value, choices: Tuple[str, ...]) -> None:
    """A str option: TypeError for another type, ValueError for a value outside `choices`."""
    check_python_types(op, (), ((name, value),))
    if value not in choices:
        allowed = " or ".join(f'"{c}"' for c in choices)
        raise ValueError(f'nvfp4kv.{op}: {name} must be {allowed}, got "{value}"')


def _check_int(op: str, name: str, value, minimum: int) -> None:
    """A Python int (torch.SymInt under torch.compile; not a bool) of at least `minimum` (0 or 1)."""
    kind = "a positive int" if minimum == 1 else "a non-negative int"
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        raise TypeError(f"nvfp4kv.{op}: {name} must be {kind}, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"nvfp4kv.{op}: {name} must be {kind}, got {value}")


def _check_index_vector(op: str, name: str, t) -> None:
    """A 1-D int32 or int64 tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"nvfp4kv.{op}: {name} must be a 1-D int32 or int64 tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise ValueError(
            f"nvfp4kv.{op}: {name} must be a 1-D int32 or int64 tensor, got dtype "
            f"{_dtype_name(t.dtype)}, shape {list(t.shape)}"
        )


def _check_same_device(op: str, name: str, t: torch.Tensor, reference_name: str, reference: torch.Tensor) -> None:
    if t.device != reference.device:
        raise ValueError(
            f"nvfp4kv.{op}: {name} must be on {reference_name}'s device ({reference.device}), got {t.device}"
        )


def _check_indptr(op: str, indptr_name: str, indptr, lengths_name: str, lengths) -> None:
    """An indptr [batch_size + 1] and a per-request vector [batch_size] on its device."""
    _check_index_vector(op, indptr_name, indptr)
    _check_index_vector(op, lengths_name, lengths)
    if indptr.numel() < 1:
        raise ValueError(f"nvfp4kv.{op}: {indptr_name} must have at least one entry (batch_size + 1), got 0")
    if lengths.numel() != indptr.numel() - 1:
        raise ValueError(
            f"nvfp4kv.{op}: {lengths_name} must have len({indptr_name}) - 1 = {indptr.numel() - 1} "
            f"entries, got {lengths.numel()}"
        )
    _check_same_device(op, lengths_name, lengths, indptr_name, indptr)


def get_seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Sequence length of each request: full pages times page_size plus the last page's entries
    (max(kv_indptr[b+1] - kv_indptr[b] - 1, 0) * page_size + kv_last_page_len[b]).

    Plain arithmetic on the inputs' device (no synchronisation, capturable); any index values are safe
    (integer overflow wraps). kv_indptr: [batch_size + 1], kv_last_page_len: [batch_size], int32/int64.
    """
    _check_indptr("get_seq_lens", "kv_indptr", kv_indptr, "kv_last_page_len", kv_last_page_len)
    _check_int("get_seq_lens", "page_size", page_size, 1)
    full_pages = torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0)
    return full_pages * page_size + kv_last_page_len


def get_batch_indices_positions(
    append_indptr: torch.Tensor, seq_lens: torch.Tensor, nnz: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """int32 (batch_indices, positions) of the nnz appended rows.

    Row j of request b (append_indptr[b] <= j < append_indptr[b+1]) gets b and
    seq_lens[b] - (append_indptr[b+1] - append_indptr[b]) + (j - append_indptr[b]).
    append_indptr: [batch_size + 1], seq_lens: [batch_size], int32/int64 on one device; nnz: an int.
    Runs on the inputs' device without synchronising (nnz is given), so it can be captured.

    Any index values are memory-safe. A row j in [0, nnz) that no request covers (counts that do not
    add up to nnz, negative counts), or whose position would fall outside [0, 2**31), gets (-1, -1),
    which the append ops skip. With a non-decreasing append_indptr every other row is exact; with a
    decreasing one a covered row may also get (-1, -1), and never a wrong target.
    """
    op = "get_batch_indices_positions"
    _check_indptr(op, "append_indptr", append_indptr, "seq_lens", seq_lens)
    _check_int(op, "nnz", nnz, 0)
    device = append_indptr.device
    batch_size = seq_lens.numel()
    if batch_size == 0:
        return (
            torch.full((nnz,), -1, dtype=torch.int32, device=device),
            torch.full((nnz,), -1, dtype=torch.int32, device=device),
        )
    rows = torch.arange(nnz, device=device)
    indptr = append_indptr.long()
    # The request holding row j when append_indptr is non-decreasing; for other data some request,
    # which the coverage test below accepts only when it does hold the row.
    b = torch.searchsorted(indptr[1:], rows, right=True).clamp_(0, batch_size - 1)
    start, end = indptr[b], indptr[b + 1]
    covered = (start <= rows) & (rows < end)
    # The position is seq_lens[b] - (end - j). On covered rows end - j lies in [1, 2**63) (1 elsewhere),
    # and seq_lens clamped at -1 (any negative value gives an invalid row) keeps the difference in int64.
    positions = seq_lens.long().clamp(min=-1)[b] - (torch.where(covered, end, rows + 1) - rows)
    valid = covered & (positions >= 0) & (positions <= _INT32_MAX)
    return (torch.where(valid, b, -1).to(torch.int32), torch.where(valid, positions, -1).to(torch.int32))


def _check_trtllm_tiles(op: str, subject: str, page_size: int, blocks: int) -> None:
    if page_size % 4 != 0 or blocks % 4 != 0:
        raise ValueError(
            f"nvfp4kv.{op}: {subject} needs page_size % 4 == 0 and head_dim % 64 == 0, got "
            f"page_size {page_size} and head_dim {blocks * 16}"
        )


def _cache_halves(op: str, name: str, cache: Cache, dtype: torch.dtype) -> Tuple[Tuple[torch.Tensor, str], ...]:
    """((K, its name), (V, its name)): the 4-D halves of a (K, V) tuple or of one stacked 5-D tensor."""
    first, second = split_cache(cache, name)
    parts = ((first, name),) if second is None else ((first, f"{name}[0]"), (second, f"{name}[1]"))
    check_python_types(op, [(part, t) for t, part in parts], ())
    for t, part in parts:
        if t.dtype != dtype:
            raise ValueError(f"nvfp4kv.{op}: {part} must have dtype {_dtype_name(dtype)}, got {_dtype_name(t.dtype)}")
        if second is None and (t.dim() != 5 or t.shape[1] != 2):
            raise ValueError(
                f"nvfp4kv.{op}: {part} as one tensor must be 5-D with K/V on dim 1 ([max_num_pages, 2, "
                f"...]), got shape {list(t.shape)}"
            )
        if second is not None and t.dim() != 4:
            raise ValueError(f"nvfp4kv.{op}: {part} must be a 4-D tensor, got shape {list(t.shape)}")
    return parts if second is not None else ((first[:, 0], name), (first[:, 1], name))


def _dequantize_scale(op: str, name: str, scale: Scale, device: torch.device) -> Scale:
    """A positive finite float32 value, or a one-element float32 tensor on the cache's device (as a 0-d
    tensor, so that it cannot broadcast); one on the CPU with a CUDA cache is read on the host, as the appends
    read it, and checked as its float."""
    value, tensor = scale_argument(op, name, scale)
    host_read = tensor is not None and tensor.device.type == "cpu" != device.type
    if host_read and tensor.dtype == torch.float32 and tensor.numel() == 1:
        scale = value = float(tensor.reshape(()))
        tensor = None
    if tensor is None:
        if not 0.0 < float(torch.tensor(value, dtype=torch.float32)) < float("inf"):
            raise ValueError(
                f"nvfp4kv.{op}: {name} must be a positive finite global decode scale in float32, got {scale}"
            )
        return value
    if tensor.dtype != torch.float32 or tensor.numel() != 1 or tensor.device != device:
        where = f"{device}) or the CPU" if device.type != "cpu" else f"{device})"
        raise ValueError(
            f"nvfp4kv.{op}: {name} as a tensor must be a one-element float32 tensor on paged_kv_cache's "
            f"device ({where}, got dtype {_dtype_name(tensor.dtype)}, shape {list(tensor.shape)}, "
            f"device {tensor.device}"
        )
    return tensor.reshape(())


def _first(mask: torch.Tensor) -> Optional[int]:
    """The index of the first True of a 1-D CPU mask, or None."""
    hits = mask.nonzero()
    return int(hits[0, 0]) if hits.numel() else None


def _page_table_tokens(
    op: str,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    page_size: int,
    num_pages: int,
) -> torch.Tensor:
    """[2, total_tokens] int64 on the CPU: the (page id, entry) of every token of every request in order.

    The page table is copied to the host in one transfer and validated there; ValueError names the
    first bad entry. A request of n > 0 pages holds (n - 1) * page_size + kv_last_page_len[b] tokens.
    """
    name = f"nvfp4kv.{op}"
    batch_size = kv_last_page_len.numel()
    host = torch.cat([kv_indptr, kv_last_page_len, kv_indices]).cpu().long()
    indptr, last, indices = host.split([batch_size + 1, batch_size, kv_indices.numel()])
    if indptr[0] < 0:
        raise ValueError(f"{name}: kv_indptr[0] must be >= 0, got {int(indptr[0])}")
    b = _first(indptr[1:] < indptr[:-1])  # compared, not subtracted: no overflow
    if b is not None:
        raise ValueError(
            f"{name}: kv_indptr must be non-decreasing, got kv_indptr[{b + 1}] = {int(indptr[b + 1])} "
            f"after kv_indptr[{b}] = {int(indptr[b])}"
        )
    if indptr[-1] > indices.numel():
        raise ValueError(f"{name}: kv_indptr[-1] must be <= len(kv_indices) = {indices.numel()}, got {int(indptr[-1])}")
    has_pages = indptr[1:] > indptr[:-1]
    b = _first(torch.where(has_pages, (last < 1) | (last > page_size), last != 0))
    if b is not None:
        expected = (
            f"in [1, page_size = {page_size}] for a request with pages"
            if has_pages[b]
            else "0 for a request without pages"
        )
        raise ValueError(f"{name}: kv_last_page_len[{b}] must be {expected}, got {int(last[b])}")
    begin = int(indptr[0])
    used = indices[begin : int(indptr[-1])]
    k = _first((used < 0) | (used >= num_pages))
    if k is not None:
        raise ValueError(
            f"{name}: kv_indices[{begin + k}] must be a page id in [0, max_num_pages = {num_pages}), got {int(used[k])}"
        )
    seq_lens = get_seq_lens(indptr, last, page_size)
    batch = torch.repeat_interleave(torch.arange(batch_size), seq_lens)
    positions = torch.arange(batch.numel()) - (torch.cumsum(seq_lens, 0) - seq_lens)[batch]
    return torch.stack([indices[indptr[batch] + positions // page_size], positions % page_size])


def dequantize_paged_kv_cache(
    paged_kv_cache: Cache,
    kv_cache_sf: Cache,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    k_scale: Scale,
    v_scale: Scale,
    kv_layout: str = "NHD",
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    v_sf_layout: str = "linear",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ragged K and V [total_tokens, num_kv_heads, head_dim] of all requests in order (request 0's
    tokens first), dequantized from the paged NVFP4 cache: what a non-FP4 attention kernel or a
    debugger needs.

    The caches and scales are those of nvfp4_quantize_append_paged_kv_cache (k_scale / v_scale: positive
    finite floats or one-element float32 tensors on the cache's device or the CPU); the index tensors are int32 /
    int64 on the cache's device. The page table is copied to the host (one synchronisation) and must be
    valid, else ValueError names its first bad entry: kv_indptr starts at >= 0, never decreases and
    ends at <= len(kv_indices); kv_last_page_len[b] is in [1, page_size] for a request with pages and
    0 for one without; the page ids kv_indices[kv_indptr[0]:kv_indptr[-1]] are in [0, max_num_pages).
    """
    op = "dequantize_paged_kv_cache"
    name = f"nvfp4kv.{op}"
    _check_choice(op, "kv_layout", kv_layout, ("NHD", "HND"))
    _check_choice(op, "v_sf_layout", v_sf_layout, ("linear", "trtllm"))
    if not isinstance(out_dtype, torch.dtype):
        raise TypeError(f"{name}: out_dtype must be a floating-point torch.dtype, got {out_dtype!r}")
    if not out_dtype.is_floating_point:
        raise ValueError(f"{name}: out_dtype must be a floating-point torch.dtype, got {out_dtype}")
    (k_cache, k_name), (v_cache, v_name) = _cache_halves(op, "paged_kv_cache", paged_kv_cache, torch.uint8)
    (k_sf, k_sf_name), (v_sf, v_sf_name) = _cache_halves(op, "kv_cache_sf", kv_cache_sf, torch.float8_e4m3fn)
    nhd = kv_layout == "NHD"
    num_pages, page_size, width = k_cache.shape[0], k_cache.shape[1 if nhd else 2], k_cache.shape[3]
    if page_size < 1:
        raise ValueError(f"{name}: {k_name} must have page_size >= 1, got shape {list(k_cache.shape)}")
    if width % 8 != 0:
        raise ValueError(
            f"{name}: {k_name} must have a last dim head_dim/2 that is a multiple of 8, got shape {list(k_cache.shape)}"
        )
    dims = "[max_num_pages, page_size, num_kv_heads, " if nhd else "[max_num_pages, num_kv_heads, page_size, "
    for t, part, last in (
        (v_cache, v_name, "head_dim/2"),
        (k_sf, k_sf_name, "head_dim/16"),
        (v_sf, v_sf_name, "head_dim/16"),
    ):
        expected = [*k_cache.shape[:3], width if last == "head_dim/2" else width // 8]
        if list(t.shape) != expected:
            raise ValueError(
                f"{name}: {part} must have shape {dims}{last}] = {expected} for kv_layout {kv_layout}, "
                f"got {list(t.shape)}"
            )
        _check_same_device(op, part, t, k_name, k_cache)
    _check_index_vector(op, "kv_indices", kv_indices)
    _check_indptr(op, "kv_indptr", kv_indptr, "kv_last_page_len", kv_last_page_len)
    for t, part in ((kv_indices, "kv_indices"), (kv_indptr, "kv_indptr")):  # kv_last_page_len: on kv_indptr's
        _check_same_device(op, part, t, "paged_kv_cache", k_cache)
    k_scale = _dequantize_scale(op, "k_scale", k_scale, k_cache.device)
    v_scale = _dequantize_scale(op, "v_scale", v_scale, k_cache.device)
    if v_sf_layout != "linear":
        _check_trtllm_tiles(op, f'v_sf_layout "{v_sf_layout}"', page_size, width // 8)

    pages, entries = _page_table_tokens(op, kv_indices, kv_indptr, kv_last_page_len, page_size, num_pages).to(
        k_cache.device
    )
    if v_sf_layout != "linear":
        v_sf = convert_v_scale_layout(v_sf, src=v_sf_layout, dst="linear", kv_layout=kv_layout)

    def gather(cache: torch.Tensor) -> torch.Tensor:  # -> [total, heads, width]
        return cache[pages, entries] if nhd else cache[pages, :, entries]

    def read(cache: torch.Tensor, sf: torch.Tensor, scale: Scale) -> torch.Tensor:
        if isinstance(scale, torch.Tensor):
            # (e2m1 * sf) * 1.0 is exact, so multiplying by the tensor afterwards rounds exactly as
            # the op's (e2m1 * sf) * s does.
            return (torch.ops.nvfp4kv.dequantize(gather(cache), gather(sf), 1.0) * scale).to(out_dtype)
        return torch.ops.nvfp4kv.dequantize(gather(cache), gather(sf), scale).to(out_dtype)

    return read(k_cache, k_sf, k_scale), read(v_cache, v_sf, v_scale)


def dequantize_paged_mla_kv_cache(
    ckv_cache: torch.Tensor,
    ckv_sf_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    ckv_scale: Scale,
    kpe_scale: Scale,
    out_dtype: torch.dtype = torch.bfloat16,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Ragged ckv [total_tokens, C] and kpe [total_tokens, R] of all requests in order, read back from the caches of
    nvfp4_quantize_append_paged_mla_kv_cache: ckv = e2m1 * sf * ckv_scale, kpe = float(byte) * kpe_scale (a kpe
    cache of a 16-bit dtype is read as it is). The page table is checked as by dequantize_paged_kv_cache."""
    op = "dequantize_paged_mla_kv_cache"
    name = f"nvfp4kv.{op}"
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise TypeError(f"{name}: out_dtype must be a floating-point torch.dtype, got {out_dtype!r}")
    check_python_types(op, (("ckv_cache", ckv_cache), ("ckv_sf_cache", ckv_sf_cache), ("kpe_cache", kpe_cache)), ())
    if ckv_cache.dtype != torch.uint8 or ckv_cache.dim() != 3 or ckv_cache.shape[1] < 1 or ckv_cache.shape[2] % 8:
        raise ValueError(
            f"{name}: ckv_cache must be uint8 [max_num_pages, page_size >= 1, ckv_dim/2] with ckv_dim % 16 == 0, "
            f"got {_dtype_name(ckv_cache.dtype)} {list(ckv_cache.shape)}"
        )
    num_pages, page_size, width = ckv_cache.shape
    for t, part, dtypes, last in (
        (ckv_sf_cache, "ckv_sf_cache", (torch.float8_e4m3fn,), width // 8),
        (kpe_cache, "kpe_cache", (torch.float8_e4m3fn, torch.float16, torch.bfloat16), None),
    ):
        if t.dtype not in dtypes or t.dim() != 3 or list(t.shape[:2]) != [num_pages, page_size]:
            raise ValueError(
                f"{name}: {part} must be {' or '.join(_dtype_name(d) for d in dtypes)} [{num_pages}, {page_size}, "
                f"{last if last is not None else 'kpe_dim'}], got {_dtype_name(t.dtype)} {list(t.shape)}"
            )
        if last is not None and t.shape[2] != last:
            raise ValueError(f"{name}: {part} must have last dim ckv_dim/16 = {last}, got {list(t.shape)}")
        _check_same_device(op, part, t, "ckv_cache", ckv_cache)
    _check_index_vector(op, "kv_indices", kv_indices)
    _check_indptr(op, "kv_indptr", kv_indptr, "kv_last_page_len", kv_last_page_len)
    for t, part in ((kv_indices, "kv_indices"), (kv_indptr, "kv_indptr")):
        _check_same_device(op, part, t, "ckv_cache", ckv_cache)
    ckv_scale = _dequantize_scale(op, "ckv_scale", ckv_scale, ckv_cache.device)
    kpe_scale = _dequantize_scale(op, "kpe_scale", kpe_scale, ckv_cache.device)
    pages, entries = _page_table_tokens(op, kv_indices, kv_indptr, kv_last_page_len, page_size, num_pages).to(
        ckv_cache.device
    )
    if isinstance(ckv_scale, torch.Tensor):  # (e2m1 * sf) * 1.0 is exact: then one rounding by the tensor
        ckv = torch.ops.nvfp4kv.dequantize(ckv_cache[pages, entries], ckv_sf_cache[pages, entries], 1.0) * ckv_scale
    else:
        ckv = torch.ops.nvfp4kv.dequantize(ckv_cache[pages, entries], ckv_sf_cache[pages, entries], ckv_scale)
    kpe = kpe_cache[pages, entries]
    if kpe.dtype == torch.float8_e4m3fn:
        kpe = kpe.float() * (kpe_scale if isinstance(kpe_scale, torch.Tensor) else torch.tensor(kpe_scale))
    return ckv.to(out_dtype), kpe.to(out_dtype)


def convert_v_scale_layout(
    v_sf: torch.Tensor,
    src: str = "linear",
    dst: str = "trtllm",
    kv_layout: str = "NHD",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Rewrites a V-scale cache [pages, T, H, S] (NHD) or [pages, H, T, S] (HND) between the "linear"
    and "trtllm" layouts (both directions; T = page_size, S = head_dim / 16). Returns a new tensor, or
    writes into `out` (which may be v_sf itself: in place). In "trtllm" each (page, head) tile of T x S
    bytes is the C-order [T/4][S][4] array indexed [t // 4][j][t % 4]; NHD stores the tile's rows at
    [page, row, head, :]. Runs on v_sf's device (CPU or CUDA) with plain tensor operations.
    """
    op = "convert_v_scale_layout"
    name = f"nvfp4kv.{op}"
    _check_choice(op, "src", src, ("linear", "trtllm"))
    _check_choice(op, "dst", dst, ("linear", "trtllm"))
    _check_choice(op, "kv_layout", kv_layout, ("NHD", "HND"))
    expected = "a 4-D float8_e4m3fn or uint8 tensor"
    if not isinstance(v_sf, torch.Tensor):
        raise TypeError(f"{name}: v_sf must be {expected}, got {type(v_sf).__name__}")
    if v_sf.dim() != 4 or v_sf.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(
            f"{name}: v_sf must be {expected}, got dtype {_dtype_name(v_sf.dtype)}, shape {list(v_sf.shape)}"
        )
    tiles = v_sf if kv_layout == "HND" else v_sf.transpose(1, 2)  # [pages, H, T, S]
    pages, heads, page_size, blocks = tiles.shape
    _check_trtllm_tiles(op, "the trtllm layout", page_size, blocks)
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"{name}: out must be a tensor matching v_sf, got {type(out).__name__}")
    if out is not None and (out.shape != v_sf.shape or out.dtype != v_sf.dtype or out.device != v_sf.device):
        raise ValueError(
            f"{name}: out must match v_sf ({list(v_sf.shape)}, {v_sf.dtype}, {v_sf.device}), got "
            f"{list(out.shape)}, {out.dtype}, {out.device}"
        )
    raw = tiles.contiguous().view(torch.uint8) if tiles.dtype != torch.uint8 else tiles.contiguous()
    if src == dst:
        converted = raw
    elif dst == "trtllm":  # [.., T/4, 4, S] -> [.., T/4, S, 4]
        converted = (
            raw.reshape(pages, heads, page_size // 4, 4, blocks)
            .transpose(-1, -2)
            .reshape(pages, heads, page_size, blocks)
        )
    else:  # [.., T/4, S, 4] -> [.., T/4, 4, S]
        converted = (
            raw.reshape(pages, heads, page_size // 4, blocks, 4)
            .transpose(-1, -2)
            .reshape(pages, heads, page_size, blocks)
        )
    converted = converted.view(v_sf.dtype)
    if kv_layout == "NHD":
        converted = converted.transpose(1, 2)
    if out is None:
        return converted.contiguous()
    return out.copy_(converted)
