"""Tokenizers: load a checkpoint folder's tokenizer with transformers, no remote code."""

from __future__ import annotations

import os
from typing import Any


def load_tokenizer(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """The tokenizer saved in a checkpoint folder (transformers, `trust_remote_code=False`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint_dir), trust_remote_code=False)
