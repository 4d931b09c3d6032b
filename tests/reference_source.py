"""The reference oracle loaded straight from python/nvfp4kv/reference.py, for the tests of the oracle
itself: importing the nvfp4kv package would load the compiled library in its __init__, and these tests
must not depend on it."""

import importlib.util
from pathlib import Path


def load_reference(module_name: str = "nvfp4kv_reference_under_test"):
    path = Path(__file__).resolve().parents[1] / "python" / "nvfp4kv" / "reference.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
