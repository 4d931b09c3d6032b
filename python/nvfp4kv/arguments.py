"""Python-side handling of the ops' arguments shared by the API functions: cache and scale forms, Python types."""

from __future__ import annotations

import enum
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


# FlashInfer's NVFP44Over6ErrMode values, and the one 4-over-6 recipe of FlashInfer's nvfp4_4over6= config that
# nvfp4kv computes (docs/SPEC.md, Extension C and the differences from FlashInfer).
_ERR_MODES = {0: "MAE", 1: "MSE"}
_FOUR_OVER_SIX_FIELDS = ("e4m3_max", "err_mode", "err_use_fast_math")


def _err_mode_name(mode) -> Optional[str]:
    """An NVFP44Over6ErrMode member (by .name, else by .value), its int value or a str, as "MAE" / "MSE" / ...;
    None for anything else."""
    if isinstance(mode, str):
        return mode.upper()
    name = getattr(mode, "name", None)
    if isinstance(name, str):
        return name.upper()
    value = getattr(mode, "value", mode)
    if isinstance(value, int) and not isinstance(value, bool):
        return _ERR_MODES.get(value)
    return None


def four_over_six_scale_search(op: str, nvfp4_4over6, scale_search) -> str:
    """The scale_search that FlashInfer's nvfp4_4over6= asks for: `scale_search` itself for None (4-over-6 off);
    "4over6" for a config (an NVFP44Over6Config, read by its fields) of MSE errors computed exactly against an
    E4M3 maximum of 448. Any other config is refused by field, and so is a scale_search besides "none" (the
    default) and "4over6"."""
    if nvfp4_4over6 is None:
        return scale_search
    if not all(hasattr(nvfp4_4over6, field) for field in _FOUR_OVER_SIX_FIELDS):
        raise TypeError(
            f"nvfp4kv.{op}: nvfp4_4over6 must be None or an NVFP44Over6Config (fields "
            f"{', '.join(_FOUR_OVER_SIX_FIELDS)}), got {type(nvfp4_4over6).__name__}"
        )
    e4m3_max, err_mode, fast_math = (getattr(nvfp4_4over6, field) for field in _FOUR_OVER_SIX_FIELDS)
    if isinstance(e4m3_max, bool) or e4m3_max != 448:
        raise ValueError(
            f"nvfp4kv.{op}: nvfp4_4over6.e4m3_max must be 448 (the 4-over-6 search uses the full E4M3 range), "
            f"got {e4m3_max!r}"
        )
    if _err_mode_name(err_mode) != "MSE":
        shown = f"{type(err_mode).__name__}.{err_mode.name}" if isinstance(err_mode, enum.Enum) else repr(err_mode)
        raise ValueError(
            f'nvfp4kv.{op}: nvfp4_4over6.err_mode must be MSE (NVFP44Over6ErrMode.MSE, 1 or "mse": the 4-over-6 '
            f"search compares squared errors), got {shown}"
        )
    if fast_math:
        raise ValueError(
            f"nvfp4kv.{op}: nvfp4_4over6.err_use_fast_math must be False (the 4-over-6 search computes its errors "
            f"exactly), got {fast_math!r}"
        )
    if scale_search not in ("none", "4over6"):
        raise ValueError(
            f'nvfp4kv.{op}: scale_search must be "none" or "4over6" when nvfp4_4over6 is given (it asks for '
            f'"4over6"), got {scale_search!r}'
        )
    return "4over6"


def check_python_types(op: str, tensors, strings) -> None:
    """TypeError naming the first argument of the wrong Python type (the op's own parser would raise a
    RuntimeError naming its schema instead)."""
    for name, value in tensors:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"nvfp4kv.{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in strings:
        if not isinstance(value, str):
            raise TypeError(f"nvfp4kv.{op}: {name} must be a str, got {type(value).__name__}")
