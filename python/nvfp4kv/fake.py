"""Fake (meta) implementations of the nvfp4kv ops, for torch.compile, export and meta tensors.

Every argument check lives once, in C++ (cpp/src/append_checks.cpp, cpp/src/mla_checks.cpp, cpp/src/rope_checks.cpp,
cpp/src/dequantize_arguments.cpp), and runs whenever the op runs: eagerly, and inside compiled or exported
code before the kernel writes anything, raising the same ValueError. The fakes only do what tracing needs:
the output shape of dequantize, and the one rule that exists only for traced code (caches sharing a storage, below).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

_PAGED_KV_ADVICE = "pass K and V as one stacked tensor [max_num_pages, 2, ...] or as separately allocated tensors"
_MLA_ADVICE = "allocate ckv_cache, ckv_sf_cache and kpe_cache separately"


def refuse_shared_storage(op: str, caches, reads, shares, advice: str = _PAGED_KV_ADVICE) -> None:
    """PyTorch's compiler mishandles mutated inputs that share a storage with another input (wrong bytes
    under dynamic shapes, failed compiles), so a traced call refuses caches that share one with each other
    or with any other argument; eager calls take such caches (disjoint halves of a pool). `shares(a, b)`
    says whether two tensors share a storage: the fakes ask torch; the API, traced by TorchDynamo before
    PyTorch's own checks of aliased inputs run, compares view bases."""
    caches = [(t, name) for t, name in caches if t is not None]
    others = caches + [(t, name) for t, name in reads if isinstance(t, torch.Tensor)]
    for i, (cache, name) in enumerate(caches):
        for other, other_name in others[i + 1 :]:
            if shares(cache, other):
                raise ValueError(
                    f"nvfp4kv.{op}: {other_name} shares its storage with {name}; under torch.compile the caches must "
                    "not share a storage with each other or with another argument (PyTorch miscompiles mutated "
                    f"aliased inputs): {advice}"
                )


def _refuse_shared_storage_under_compile(op: str, caches, reads, advice: str = _PAGED_KV_ADVICE) -> None:
    if torch.compiler.is_compiling():
        refuse_shared_storage(op, caches, reads, torch._C._is_alias_of, advice)


def _refuse_mixed_devices(op: str, reference, tensors, scales, reference_name: str = "append_key") -> None:
    """A call mixing a meta tensor with real ones dispatches here instead of to a kernel: refuse it with
    the kernels' messages (cpp/src/shared_checks.cpp: check_devices, check_scale), not silently do nothing.
    A scale tensor on the CPU goes with inputs on any device (the op reads it on the host)."""
    device = reference.device
    for tensor, name in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device != device:
            raise ValueError(
                f"nvfp4kv.{op}: {name} must be on the same device as {reference_name} ({device}), got {tensor.device}"
            )
    or_cpu = "" if device.type == "cpu" else " or the CPU"
    for tensor, name in scales:
        if isinstance(tensor, torch.Tensor) and tensor.device not in (device, torch.device("cpu")):
            raise ValueError(
                f"nvfp4kv.{op}: {name} as a tensor must be a one-element float32 tensor on {reference_name}'s device "
                f"({device}){or_cpu}, got dtype {str(tensor.dtype).removeprefix('torch.')}, shape "
                f"[{', '.join(str(n) for n in tensor.shape)}], device {tensor.device}"
            )


def _cache_names(v_cache: Optional[torch.Tensor]) -> Tuple[str, str, str, str]:
    if v_cache is None:  # stacked: one tensor each
        return "paged_kv_cache", "", "kv_cache_sf", ""
    return "paged_kv_cache[0]", "paged_kv_cache[1]", "kv_cache_sf[0]", "kv_cache_sf[1]"


def _check_traced_append(op: str, append_key, append_value, rows, tables, caches, scale_tensors) -> None:
    """What an append's fake checks. `rows` and `tables` are the (tensor, name) index arguments the C++
    checks before and after the caches' devices; `caches` (k_cache, v_cache, k_cache_sf, v_cache_sf);
    `scale_tensors` (k_scale_tensor, v_scale_tensor)."""
    k_cache, v_cache, k_cache_sf, v_cache_sf = caches
    devices = [(append_value, "append_value"), *rows, (k_cache, "paged_kv_cache"), (k_cache_sf, "kv_cache_sf"),
               *tables, (v_cache, "paged_kv_cache[1]"), (v_cache_sf, "kv_cache_sf[1]")]  # fmt: skip
    scales = list(zip(scale_tensors, ("k_scale", "v_scale")))
    _refuse_mixed_devices(op, append_key, devices, scales)
    others = [(append_key, "append_key"), (append_value, "append_value"), *rows, *tables, *scales]
    _refuse_shared_storage_under_compile(op, list(zip(caches, _cache_names(v_cache))), others)


@torch.library.register_fake("nvfp4kv::append_paged_kv_cache")
def _append_paged_kv_cache_fake(
    append_key,
    append_value,
    batch_indices,
    positions,
    k_cache,
    v_cache,
    k_cache_sf,
    v_cache_sf,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    k_scale,
    v_scale,
    kv_layout,
    k_scale_tensor=None,
    v_scale_tensor=None,
    v_sf_layout="linear",
    scale_search="none",
) -> None:
    rows = [(batch_indices, "batch_indices"), (positions, "positions")]
    tables = [(kv_indices, "kv_indices"), (kv_indptr, "kv_indptr"), (kv_last_page_len, "kv_last_page_len")]
    _check_traced_append("append_paged_kv_cache", append_key, append_value, rows, tables,
                         (k_cache, v_cache, k_cache_sf, v_cache_sf), (k_scale_tensor, v_scale_tensor))  # fmt: skip


@torch.library.register_fake("nvfp4kv::append_paged_kv_cache_with_slot_mapping")
def _append_paged_kv_cache_with_slot_mapping_fake(
    append_key,
    append_value,
    slot_mapping,
    k_cache,
    v_cache,
    k_cache_sf,
    v_cache_sf,
    k_scale,
    v_scale,
    kv_layout,
    k_scale_tensor=None,
    v_scale_tensor=None,
    v_sf_layout="linear",
    scale_search="none",
) -> None:
    _check_traced_append("append_paged_kv_cache_with_slot_mapping", append_key, append_value,
                         [(slot_mapping, "slot_mapping")], [], (k_cache, v_cache, k_cache_sf, v_cache_sf),
                         (k_scale_tensor, v_scale_tensor))  # fmt: skip


_MLA_CACHE_NAMES = ("ckv_cache", "ckv_sf_cache", "kpe_cache")


def _check_traced_mla_append(op: str, append_ckv, append_kpe, rows, tables, caches, scale_tensors) -> None:
    """The MLA appends' counterpart of _check_traced_append; `caches` (ckv_cache, ckv_sf_cache, kpe_cache)."""
    cache_args = list(zip(caches, _MLA_CACHE_NAMES))
    scales = list(zip(scale_tensors, ("ckv_scale", "kpe_scale")))
    _refuse_mixed_devices(op, append_ckv, [(append_kpe, "append_kpe"), *rows, *cache_args, *tables], scales,
                          "append_ckv")  # fmt: skip
    others = [(append_ckv, "append_ckv"), (append_kpe, "append_kpe"), *rows, *tables, *scales]
    _refuse_shared_storage_under_compile(op, cache_args, others, _MLA_ADVICE)


@torch.library.register_fake("nvfp4kv::append_paged_mla_kv_cache")
def _append_paged_mla_kv_cache_fake(
    append_ckv,
    append_kpe,
    batch_indices,
    positions,
    ckv_cache,
    ckv_sf_cache,
    kpe_cache,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    ckv_scale,
    kpe_scale,
    ckv_scale_tensor=None,
    kpe_scale_tensor=None,
) -> None:
    rows = [(batch_indices, "batch_indices"), (positions, "positions")]
    tables = [(kv_indices, "kv_indices"), (kv_indptr, "kv_indptr"), (kv_last_page_len, "kv_last_page_len")]
    _check_traced_mla_append("append_paged_mla_kv_cache", append_ckv, append_kpe, rows, tables,
                             (ckv_cache, ckv_sf_cache, kpe_cache), (ckv_scale_tensor, kpe_scale_tensor))  # fmt: skip


@torch.library.register_fake("nvfp4kv::append_paged_mla_kv_cache_with_slot_mapping")
def _append_paged_mla_kv_cache_with_slot_mapping_fake(
    append_ckv,
    append_kpe,
    slot_mapping,
    ckv_cache,
    ckv_sf_cache,
    kpe_cache,
    ckv_scale,
    kpe_scale,
    ckv_scale_tensor=None,
    kpe_scale_tensor=None,
) -> None:
    _check_traced_mla_append("append_paged_mla_kv_cache_with_slot_mapping", append_ckv, append_kpe,
                             [(slot_mapping, "slot_mapping")], [], (ckv_cache, ckv_sf_cache, kpe_cache),
                             (ckv_scale_tensor, kpe_scale_tensor))  # fmt: skip


def _check_traced_rope_append(op: str, key, value, rows, tables, caches, scale_tensors, rotation) -> None:
    """The fused RoPE appends' counterpart of _check_traced_append: `rotation` (query, cos_sin_cache,
    rope_positions, q_out, k_out, q_scale_tensor)."""
    query, cos_sin_cache, rope_positions, q_out, k_out, q_scale_tensor = rotation
    k_cache, v_cache, k_cache_sf, v_cache_sf = caches
    devices = [(value, "value"), *rows, (k_cache, "paged_kv_cache"), (k_cache_sf, "kv_cache_sf"), *tables,
               (v_cache, "paged_kv_cache[1]"), (v_cache_sf, "kv_cache_sf[1]"), (query, "query"),
               (cos_sin_cache, "cos_sin_cache"), (rope_positions, "rope_positions"), (q_out, "q_out"),
               (k_out, "k_out")]  # fmt: skip
    scales = list(zip((*scale_tensors, q_scale_tensor), ("k_scale", "v_scale", "q_scale")))
    _refuse_mixed_devices(op, key, devices, scales, "key")
    written = [*zip(caches, _cache_names(v_cache)), (q_out, "q_out"), (k_out, "k_out")]
    others = [(key, "key"), (value, "value"), *rows, *tables, (query, "query"), (cos_sin_cache, "cos_sin_cache"),
              (rope_positions, "rope_positions"), *scales]  # fmt: skip
    _refuse_shared_storage_under_compile(op, written, others)


@torch.library.register_fake("nvfp4kv::rope_append_paged_kv_cache")
def _rope_append_paged_kv_cache_fake(
    append_key,
    append_value,
    batch_indices,
    positions,
    k_cache,
    v_cache,
    k_cache_sf,
    v_cache_sf,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    k_scale,
    v_scale,
    kv_layout,
    k_scale_tensor,
    v_scale_tensor,
    v_sf_layout,
    scale_search,
    query,
    cos_sin_cache,
    rope_positions,
    q_out,
    k_out,
    is_neox,
    q_scale,
    q_scale_tensor,
) -> None:
    rows = [(batch_indices, "batch_indices"), (positions, "positions")]
    tables = [(kv_indices, "kv_indices"), (kv_indptr, "kv_indptr"), (kv_last_page_len, "kv_last_page_len")]
    _check_traced_rope_append("rope_append_paged_kv_cache", append_key, append_value, rows, tables,
                              (k_cache, v_cache, k_cache_sf, v_cache_sf), (k_scale_tensor, v_scale_tensor),
                              (query, cos_sin_cache, rope_positions, q_out, k_out, q_scale_tensor))  # fmt: skip


@torch.library.register_fake("nvfp4kv::rope_append_paged_kv_cache_with_slot_mapping")
def _rope_append_paged_kv_cache_with_slot_mapping_fake(
    append_key,
    append_value,
    slot_mapping,
    k_cache,
    v_cache,
    k_cache_sf,
    v_cache_sf,
    k_scale,
    v_scale,
    kv_layout,
    k_scale_tensor,
    v_scale_tensor,
    v_sf_layout,
    scale_search,
    query,
    cos_sin_cache,
    rope_positions,
    q_out,
    k_out,
    is_neox,
    q_scale,
    q_scale_tensor,
) -> None:
    _check_traced_rope_append("rope_append_paged_kv_cache_with_slot_mapping", append_key, append_value,
                              [(slot_mapping, "slot_mapping")], [], (k_cache, v_cache, k_cache_sf, v_cache_sf),
                              (k_scale_tensor, v_scale_tensor),
                              (query, cos_sin_cache, rope_positions, q_out, k_out, q_scale_tensor))  # fmt: skip


@torch.library.register_fake("nvfp4kv::dequantize")
def _dequantize_fake(packed, scales, global_scale):
    width = packed.shape[-1] * 2 if packed.dim() else 0  # a 0-d packed is refused when the op runs
    return packed.new_empty((*packed.shape[:-1], width), dtype=torch.float32)
