"""Release tokenizers load without remote code; chat templates and mask ids follow
docs/models.md#tokenizers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dllm_models import load_tokenizer

CHECKPOINTS = Path(__file__).resolve().parents[3] / "shared" / "checkpoints"
needs_shared = pytest.mark.skipif(
    not CHECKPOINTS.is_dir(), reason="needs ../shared/checkpoints beside the repository"
)
SDAR = ["SDAR-1dot7B-Chat", "SDAR-4B-Chat", "SDAR-8B-Chat", "SDAR-30B-A3B-Chat"]
HI = [{"role": "user", "content": "Hi"}]


def _prompt(tok: Any, **kwargs: Any) -> str:
    out: str = tok.apply_chat_template(HI, tokenize=False, add_generation_prompt=True, **kwargs)
    return out


@pytest.fixture(scope="module")
def dream_tok() -> Any:
    return load_tokenizer(CHECKPOINTS / "Dream-v0-Instruct-7B")


@needs_shared
def test_dream_custom_class_falls_back_to_qwen2(dream_tok: Any) -> None:
    assert type(dream_tok).__name__ == "Qwen2Tokenizer"
    assert dream_tok.mask_token == "<|mask|>" and dream_tok.mask_token_id == 151666
    assert dream_tok.eos_token_id == 151643 and dream_tok.pad_token_id == 151643
    assert dream_tok.convert_tokens_to_ids("<|beginoftext|>") == 151665
    # the mask token is one id, never split into pieces
    ids = dream_tok("a<|mask|><|mask|>b")["input_ids"]
    assert ids.count(151666) == 2


@needs_shared
def test_dream_chat_template_inserts_default_system(dream_tok: Any) -> None:
    assert _prompt(dream_tok) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@needs_shared
@pytest.mark.parametrize("folder", SDAR)
def test_sdar_tokenizer_mask_and_chat_template(folder: str) -> None:
    tok = load_tokenizer(CHECKPOINTS / folder)
    assert tok.mask_token_id == 151669
    assert tok.convert_tokens_to_ids("<|MASK|>") == 151669
    assert tok.eos_token_id == 151643 and tok.pad_token_id == 151643
    assert tok.convert_tokens_to_ids("<|im_end|>") == 151645
    assert _prompt(tok) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert _prompt(tok, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@needs_shared
@pytest.mark.parametrize("folder", ["LLaDA-8B-Instruct", "LLaDA2.0-mini"])
def test_folder_without_vocabulary_is_a_clear_error(folder: str) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer vocabulary"):
        load_tokenizer(CHECKPOINTS / folder)
