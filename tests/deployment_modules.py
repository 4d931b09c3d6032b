"""Modules whose forward appends through nvfp4kv, for the Python-free deployment routes (TorchScript,
torch.export, AOTInductor). Shared by tests/test_export.py and tests/cpp/make_deployment_artifacts.py,
whose artifacts the C++ tests in tests/cpp load and run (ctest)."""

from __future__ import annotations

from typing import List, Tuple

import torch

import nvfp4kv  # noqa: F401  (registers the ops and their fake implementations)

from append_cases import make_append_case


class AppendAndDequantize(torch.nn.Module):
    """Appends K/V rows into a (K, V) paged cache in place and returns the dequantized K cache.

    The scales and the layout are fixed at construction, as a deployed model would have them.
    """

    def __init__(self, k_scale: float, v_scale: float, kv_layout: str):
        super().__init__()
        self.k_scale = k_scale
        self.v_scale = v_scale
        self.kv_layout = kv_layout

    def forward(
        self,
        append_key: torch.Tensor,
        append_value: torch.Tensor,
        batch_indices: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k_cache_sf: torch.Tensor,
        v_cache_sf: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_last_page_len: torch.Tensor,
    ) -> torch.Tensor:
        torch.ops.nvfp4kv.append_paged_kv_cache(
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
            self.k_scale,
            self.v_scale,
            self.kv_layout,
        )
        return torch.ops.nvfp4kv.dequantize(k_cache, k_cache_sf, self.k_scale)


# Positions of the mutated cache tensors among the forward's inputs.
CACHE_INPUTS = (4, 5, 6, 7)


def make_inputs(layout: str, seed: int) -> Tuple[AppendAndDequantize, List[torch.Tensor]]:
    """A module and its CPU inputs: a random prefill case with four separate, contiguous cache tensors
    (poisoned with random bytes, so comparing whole caches proves which bytes were written)."""
    case = make_append_case(layout=layout, seed=seed, head_dim=64, num_heads=4, batch_size=3)
    k_cache, v_cache = (c.contiguous() for c in case.paged_kv_cache)
    k_cache_sf, v_cache_sf = (c.contiguous() for c in case.kv_cache_sf)
    inputs = [
        case.append_key,
        case.append_value,
        case.batch_indices,
        case.positions,
        k_cache,
        v_cache,
        k_cache_sf,
        v_cache_sf,
        case.kv_indices,
        case.kv_indptr,
        case.kv_last_page_len,
    ]
    return AppendAndDequantize(case.k_scale, case.v_scale, layout), inputs


def cloned(inputs: List[torch.Tensor]) -> List[torch.Tensor]:
    return [t.clone() for t in inputs]
