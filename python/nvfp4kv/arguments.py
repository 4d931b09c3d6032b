"""Python-side handling of the ops' arguments shared by the API functions: cache and scale forms, Python types."""

from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch

Cache = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def split_cache(cache: Cache, name: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(K, V) for a tuple cache; (stacked, None) for one 5-D tensor, which the op takes whole."""
    if isinstance(cache, torch.Tensor):
        return cache, None
    if isinstance(cache, (tuple, list)) and len(cache) == 2:
        return cache[0], cache[1]
    raise TypeError(
        f"nvfp4kv: {name} must be a tensor or a (K, V) tuple of two "
        f"tensors, got {type(cache).__name__}"
        + (f" of length {len(cache)}" if isinstance(cache, (tuple, list)) else "")
    )


Scale = Union[float, torch.Tensor]


def scale_argument(op: str, name: str, scale) -> Tuple[float, Optional[torch.Tensor]]:
    """(value, tensor) as the op takes a global scale: a real number (not a bool), or a tensor."""
    if isinstance(scale, torch.Tensor):
        return 1.0, scale
    if isinstance(scale, (torch.SymFloat, torch.SymInt)):
        return scale, None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"nvfp4kv.{op}: {name} must be a float or a one-element float32 tensor, got {type(scale).__name__}"
        )
    return float(scale), None


def check_python_types(op: str, tensors, strings) -> None:
    """TypeError naming the first argument of the wrong Python type (the op's own parser would raise a
    RuntimeError naming its schema instead)."""
    for name, value in tensors:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"nvfp4kv.{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in strings:
        if not isinstance(value, str):
            raise TypeError(f"nvfp4kv.{op}: {name} must be a str, got {type(value).__name__}")
