"""Tokenizers: load a checkpoint folder's tokenizer with transformers, no remote code."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Custom tokenizer classes of the releases -> the transformers class they are built on. Dream's
# `DreamTokenizer` is Qwen2's byte-level BPE over vocab.json/merges.txt plus its added tokens.
NATIVE_TOKENIZER = {"DreamTokenizer": "Qwen2Tokenizer"}


def has_tokenizer(checkpoint_dir: str | os.PathLike[str]) -> bool:
    """Whether a folder holds tokenizer vocabulary files (tokenizer.json, or vocab.json + merges.txt)."""
    root = Path(checkpoint_dir)
    return (root / "tokenizer.json").is_file() or (
        (root / "vocab.json").is_file() and (root / "merges.txt").is_file()
    )


def load_tokenizer(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """The tokenizer saved in a checkpoint folder, built by transformers without remote code.

    The class named by tokenizer_config.json's `tokenizer_class` is used when transformers has
    it; a release's custom class is replaced by the native class it derives from
    (`NATIVE_TOKENIZER`); added tokens, special tokens and the chat template (from
    tokenizer_config.json or chat_template.jinja) are kept.

    Args:
        checkpoint_dir: folder with tokenizer.json, or vocab.json + merges.txt, and
            tokenizer_config.json.

    Returns:
        A transformers tokenizer.

    Raises:
        CheckpointFilesError (a ValueError and a FileNotFoundError): no vocabulary files.
    """
    import transformers

    from dllm_models.checkpoint import CheckpointFilesError

    root = Path(checkpoint_dir)
    if not has_tokenizer(root):
        raise CheckpointFilesError(
            f"{root} has no tokenizer vocabulary (tokenizer.json, or vocab.json + merges.txt); "
            "copy the release's tokenizer files (tokenizer.json or vocab.json + merges.txt, and "
            "tokenizer_config.json) into the folder"
        )
    cfg_path = root / "tokenizer_config.json"
    cls_name = ""
    if cfg_path.is_file():
        cls_name = str(json.loads(cfg_path.read_text()).get("tokenizer_class") or "")
    native = NATIVE_TOKENIZER.get(cls_name, cls_name)
    cls = getattr(transformers, native, None) if native else None
    if cls is None:
        return transformers.AutoTokenizer.from_pretrained(str(root), trust_remote_code=False)
    if native != cls_name:
        logger.info("tokenizer class %s of %s built as transformers' %s", cls_name, root, native)
    return cls.from_pretrained(str(root))
