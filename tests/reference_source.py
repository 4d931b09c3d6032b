"""The reference oracle loaded straight from python/nvfp4kv/reference.py, for the tests of the oracle
itself: importing the nvfp4kv package would load the compiled library in its __init__, and these tests
must not depend on it."""

import importlib.util
from pathlib import Path

import torch


def load_reference(module_name: str = "nvfp4kv_reference_under_test"):
    path = Path(__file__).resolve().parents[1] / "python" / "nvfp4kv" / "reference.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scale_bytes(scales) -> list:
    """E4M3 scale bytes as a flat list of ints."""
    return scales.view(torch.uint8).flatten().tolist()


def codes_of(packed) -> list:
    """Unpacked 4-bit codes of packed bytes, written here independently: low nibble first."""
    codes = []
    for byte in packed.flatten().tolist():
        codes += [byte & 0xF, byte >> 4]
    return codes
