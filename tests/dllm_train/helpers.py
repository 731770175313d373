"""Batches of the addition task for the trainer's SFT and preference tests (without the app).

Built on `tests.tiny_rl`: its character tokenizer `TOK` and tiny models of every family.
"""

from __future__ import annotations

import random

import torch

from dllm_algorithms import PreferenceBatch
from dllm_train import derive_seed
from tests.tiny_rl import TOK

PROMPT_LENGTH = 8
"""Tokens of a prompt "123+456="; the answer "0579" follows."""


def sft_batch(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, response_valid), each [count, 12]: `count` additions with answers."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(1000), rng.randrange(1000)) for _ in range(count)]
    rows = [TOK(f"{a:03d}+{b:03d}={a + b:04d}", add_special_tokens=False)["input_ids"] for a, b in pairs]
    ids = torch.tensor(rows, dtype=torch.long)
    response = torch.zeros_like(ids, dtype=torch.bool)
    response[:, PROMPT_LENGTH:] = True
    return ids, torch.ones_like(ids, dtype=torch.bool), response


def preference_pairs(step: int, count: int = 8) -> PreferenceBatch:
    """Right answers (chosen) against the answers of the other rows (rejected), deterministic in step."""
    ids, attn, resp = sft_batch(count, derive_seed(0, "pref", step))
    wrong = ids.clone()
    wrong[resp] = ids[resp].roll(1, 0)
    return PreferenceBatch(ids, attn, resp, wrong, attn, resp)


__all__ = ["PROMPT_LENGTH", "preference_pairs", "sft_batch"]
