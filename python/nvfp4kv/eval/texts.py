"""The default evaluation texts: files that ship with every CPython and Debian system."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import List


def default_texts() -> List[Path]:
    topics = Path(importlib.util.find_spec("pydoc_data.topics").origin)  # CPython's documentation topics
    return [topics, Path("/usr/share/common-licenses/GPL-3")]


def token_ids(tokenizer, path: Path, max_tokens: int):
    """The first max_tokens token ids of the file, [1, n] int64."""
    ids = tokenizer(path.read_text(encoding="utf-8"), return_tensors="pt").input_ids
    return ids[:, :max_tokens]
