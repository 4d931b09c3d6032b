"""Quantization recipes, named by '+'-joined parts: e.g. "nvfp4", "4over6", "k-only+window=64", "hadamard"."""

from __future__ import annotations

import dataclasses
from typing import List

GLOBAL_SCALES = ("layer", "head", "one")  # calibrated amax / (6 * 448) per layer, per layer and KV head; 1.0


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    quantize_k: bool = True
    quantize_v: bool = True
    scale_search: str = "none"
    global_scale: str = "layer"
    window: int = 0  # the most recent `window` tokens of each query stay in bf16
    hadamard: bool = False  # rotate K and Q by an orthonormal Hadamard matrix before quantizing K


DEFAULT_RECIPES = (
    "bf16",
    "nvfp4",
    "4over6",
    "scale=head",
    "scale=one",
    "k-only",
    "v-only",
    "window=16",
    "window=64",
    "window=128",
    "hadamard",
    "hadamard+4over6",
)


def parse_recipe(name: str) -> Recipe:
    """bf16 (no quantization) or any '+'-joined set of: nvfp4 (the plain recipe), 4over6, k-only, v-only,
    scale=layer|head|one, window=N, hadamard."""
    if name == "bf16":
        return Recipe(name, quantize_k=False, quantize_v=False)
    fields = {}
    for part in name.split("+"):
        key, _, value = part.partition("=")
        if part == "nvfp4":
            continue
        elif part == "4over6":
            fields["scale_search"] = "4over6"
        elif part in ("k-only", "v-only"):
            fields["quantize_k" if part == "v-only" else "quantize_v"] = False
        elif key == "scale" and value in GLOBAL_SCALES:
            fields["global_scale"] = value
        elif key == "window" and value.isdigit():
            fields["window"] = int(value)
        elif part == "hadamard":
            fields["hadamard"] = True
        else:
            raise ValueError(f"recipe {name!r}: unknown part {part!r} ({parse_recipe.__doc__})")
    return Recipe(name, **fields)


def parse_recipes(names: List[str]) -> List[Recipe]:
    return [parse_recipe(n) for n in names]
