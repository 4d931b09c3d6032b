"""Debug mode: validate device data on the host before each append (off by default).

Enable with nvfp4kv.set_debug_checks(True) or NVFP4KV_DEBUG=1. Each append then copies its index
tensors and tensor scales to the host, checks every row, and raises ValueError naming the first bad
row and why, before the kernel runs: a row the kernels would skip (bad batch index, position, page
slot, page id or slot), a tensor scale that is not positive and finite, or two rows of the call that
target the same cache slot (whose bytes would then be unspecified). That synchronises, so it refuses
to run inside CUDA graph capture. Under torch.compile the same checks run as an op of their own at
run time. Without debug mode, bad rows are skipped silently (the bounds contract in README.md).
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import torch

# Read by the API on every call (a plain module attribute, the cheapest check).
ENABLED = os.environ.get("NVFP4KV_DEBUG", "0") not in ("", "0", "false", "False")


def set_debug_checks(enabled: bool) -> None:
    """Turns host-side validation of index data and tensor scales on or off for every append."""
    global ENABLED
    ENABLED = bool(enabled)


def enabled() -> bool:
    return ENABLED


_APPEND = "append_paged_kv_cache"
_APPEND_WITH_SLOT_MAPPING = "append_paged_kv_cache_with_slot_mapping"
_MLA_APPEND = "append_paged_mla_kv_cache"
_MLA_APPEND_WITH_SLOT_MAPPING = "append_paged_mla_kv_cache_with_slot_mapping"
# (argument, rows it scales) of the two global scales of each op family
_SCALES = {False: (("k_scale", "K"), ("v_scale", "V")), True: (("ckv_scale", "ckv"), ("kpe_scale", "kpe"))}


def _refuse_during_capture(op: str) -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"nvfp4kv.{op}: debug checks copy device data to the host and cannot run during CUDA "
            "graph capture; turn them off (nvfp4kv.set_debug_checks(False) or NVFP4KV_DEBUG=0) "
            "while capturing"
        )


def _fail(op: str, message: str) -> None:
    raise ValueError(f"nvfp4kv.{op} (debug check): {message}")


def _check_scale_tensors(op: str, k_scale_tensor: Optional[torch.Tensor], v_scale_tensor: Optional[torch.Tensor],
                         device: torch.device, mla: bool = False):  # fmt: skip
    """The scale tensors the kernel reads; a CPU tensor with inputs on `device` elsewhere is read on the host
    by the op, which checks it as it checks a float."""
    for (name, rows), tensor in zip(_SCALES[mla], (k_scale_tensor, v_scale_tensor)):
        if tensor is None or tensor.numel() != 1:  # a malformed scale tensor: the op names it
            continue
        if tensor.device.type == "cpu" and device.type != "cpu":
            continue
        value = float(tensor.reshape(-1)[0])
        if not (value > 0.0 and value != float("inf")):
            _fail(
                op, f"{name} tensor holds {value:g}, not a positive finite scale, so the {rows} rows would be skipped"
            )


def page_geometry(k_cache: torch.Tensor, v_cache: Optional[torch.Tensor], kv_layout: str) -> Tuple[int, int]:
    """(max_num_pages, page_size) of a tuple half or a stacked cache; (0, 0) when the cache is malformed
    (the op's own checks then name the problem)."""
    stacked = v_cache is None
    if k_cache.dim() != (5 if stacked else 4) or kv_layout not in ("NHD", "HND"):
        return 0, 0
    entry_dim = (1 if kv_layout == "NHD" else 2) + int(stacked)
    return k_cache.shape[0], k_cache.shape[entry_dim]


def _well_formed(*index_tensors: torch.Tensor) -> bool:
    """Whether the index tensors are what the op takes (1-D int32/int64) and the geometry was read: the
    debug checks read them on the host only then, and leave malformed calls to the op's named errors."""
    return all(t.dim() == 1 and t.dtype in (torch.int32, torch.int64) for t in index_tensors)


class _Targets:
    """The (page, entry) slots the rows of one call write; the second row to name a slot fails."""

    def __init__(self, op: str):
        self.op = op
        self.first_row: Dict[Tuple[int, int], int] = {}

    def add(self, row: int, page: int, entry: int) -> None:
        earlier = self.first_row.setdefault((page, entry), row)
        if earlier != row:
            _fail(
                self.op,
                f"rows {earlier} and {row} both target page {page}, entry {entry}; the slot's bytes would "
                "be unspecified (a mix of both rows)",
            )


def check_index_data(
    batch_indices,
    positions,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    k_scale_tensor,
    v_scale_tensor,
    num_pages: int,
    page_size: int,
    mla: bool = False,
) -> None:
    """Every row of a page-table append, as the kernels would resolve it (append_params.h); `mla`: of the
    MLA latent append (its scale tensors are ckv_scale and kpe_scale)."""
    op = _MLA_APPEND if mla else _APPEND
    _refuse_during_capture(op)
    if (
        page_size <= 0
        or not _well_formed(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len)
        or kv_indptr.shape[0] != kv_last_page_len.shape[0] + 1
    ):
        return
    _check_scale_tensors(op, k_scale_tensor, v_scale_tensor, batch_indices.device, mla)
    batch = batch_indices.cpu().tolist()
    pos = positions.cpu().tolist()
    indices = kv_indices.cpu().tolist()
    indptr = kv_indptr.cpu().tolist()
    last_len = kv_last_page_len.cpu().tolist()
    batch_size = len(last_len)
    targets = _Targets(op)
    for row, (b, p) in enumerate(zip(batch, pos)):
        if not 0 <= b < batch_size:
            _fail(op, f"row {row}: batch index {b} is outside [0, {batch_size})")
        if p < 0:
            _fail(op, f"row {row}: position {p} is negative")
        first, last = indptr[b], indptr[b + 1]
        if not 0 <= first <= last <= len(indices):
            _fail(
                op,
                f"row {row}: request {b} has pages kv_indptr[{b}:{b + 2}] = [{first}, {last}], not a range "
                f"inside kv_indices (length {len(indices)})",
            )
        seq_len = max(last - first - 1, 0) * page_size + last_len[b]
        if p >= seq_len:
            _fail(
                op,
                f"row {row}: position {p} is beyond request {b}'s sequence length {seq_len} (from kv_indptr "
                "and kv_last_page_len)",
            )
        slot = first + p // page_size
        if slot >= last:
            _fail(op, f"row {row}: position {p} needs page slot {slot}, beyond request {b}'s pages [{first}, {last})")
        page = indices[slot]
        if not 0 <= page < num_pages:
            _fail(op, f"row {row}: kv_indices[{slot}] = {page} is outside the cache's pages [0, {num_pages})")
        targets.add(row, page, p % page_size)


def check_slot_data(slot_mapping, k_scale_tensor, v_scale_tensor, num_pages: int, page_size: int,
                    mla: bool = False) -> None:  # fmt: skip
    op = _MLA_APPEND_WITH_SLOT_MAPPING if mla else _APPEND_WITH_SLOT_MAPPING
    _refuse_during_capture(op)
    if page_size <= 0 or not _well_formed(slot_mapping):
        return
    _check_scale_tensors(op, k_scale_tensor, v_scale_tensor, slot_mapping.device, mla)
    targets = _Targets(op)
    for row, slot in enumerate(slot_mapping.cpu().tolist()):
        if slot >= num_pages * page_size:
            _fail(
                op,
                f"row {row}: slot {slot} is beyond the cache (max_num_pages * page_size = "
                f"{num_pages * page_size}); negative slots are padding",
            )
        if slot >= 0:
            targets.add(row, slot // page_size, slot % page_size)


# Under torch.compile the checks are ops of their own, run with the real tensors. Each returns a copy
# of an index tensor that the append then reads, so the compiler keeps it and runs it first (an op
# without outputs would be dropped as dead code).
@torch.library.custom_op("nvfp4kv::debug_checked_batch_indices", mutates_args=())
def checked_batch_indices(
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_last_page_len: torch.Tensor,
    k_scale_tensor: Optional[torch.Tensor],
    v_scale_tensor: Optional[torch.Tensor],
    num_pages: int,
    page_size: int,
    mla: bool = False,
) -> torch.Tensor:
    check_index_data(
        batch_indices,
        positions,
        kv_indices,
        kv_indptr,
        kv_last_page_len,
        k_scale_tensor,
        v_scale_tensor,
        num_pages,
        page_size,
        mla,
    )
    return batch_indices.clone()


@checked_batch_indices.register_fake
def _(batch_indices, *args):
    return torch.empty_like(batch_indices)


@torch.library.custom_op("nvfp4kv::debug_checked_slot_mapping", mutates_args=())
def checked_slot_mapping(
    slot_mapping: torch.Tensor,
    k_scale_tensor: Optional[torch.Tensor],
    v_scale_tensor: Optional[torch.Tensor],
    num_pages: int,
    page_size: int,
    mla: bool = False,
) -> torch.Tensor:
    check_slot_data(slot_mapping, k_scale_tensor, v_scale_tensor, num_pages, page_size, mla)
    return slot_mapping.clone()


@checked_slot_mapping.register_fake
def _(slot_mapping, *args):
    return torch.empty_like(slot_mapping)
