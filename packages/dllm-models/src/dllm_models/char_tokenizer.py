"""A character-level `transformers` tokenizer for toy tasks (tests, quick starts, benchmarks)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def char_tokenizer(alphabet: str, *, eos: str = "<|endoftext|>", mask: str = "<|mdm_mask|>",
                   extra: tuple[str, ...] = (), save_dir: Path | None = None) -> Any:
    """A real `PreTrainedTokenizerFast` with one token per character of `alphabet`.

    Ids: the characters in order, then `extra` tokens, then EOS (also the pad token), then the
    mask token. Unknown characters map to EOS. A plain chat template (turns concatenated) makes
    chat-based tools accept it.

    Args:
        alphabet: the characters, each its own token (no duplicates).
        eos, mask: the EOS / pad and mask token strings.
        extra: multi-character tokens matched before single characters (e.g. "<sep>").
        save_dir: if given, the tokenizer is saved there (`save_pretrained`).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet {alphabet!r} repeats a character; give each character once")
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for token in (*extra, eos, mask):
        vocab[token] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=eos))
    pattern = "|".join([*(re.escape(t) for t in extra), "."])
    core.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    core.decoder = decoders.Fuse()
    specials: dict[str, Any] = {"additional_special_tokens": list(extra)} if extra else {}
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, eos_token=eos, pad_token=eos, mask_token=mask, **specials
    )
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    if save_dir is not None:
        tok.save_pretrained(str(save_dir))
    return tok


__all__ = ["char_tokenizer"]
