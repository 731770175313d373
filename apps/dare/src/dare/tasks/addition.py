"""Fixed-width addition ("123+456=" -> "0579"): a generated task a tiny model can learn on CPU.

The answer is verifiable (exact match), the data are unlimited, and held-out prompts are pairs
never drawn for training, so held-out accuracy measures generalisation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

EOS = "<|endoftext|>"
MASK = "<|mdm_mask|>"
ALPHABET = "0123456789+="


@dataclass(frozen=True, kw_only=True)
class AdditionConfig:
    """The task.

    Attributes:
        digits: digits of each operand (answers have digits + 1, zero-padded).
        num_eval: held-out prompts (never used in training).
        seed: seed of the held-out split.
    """

    digits: int = 3
    num_eval: int = 500
    seed: int = 1234

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 6:
            raise ValueError(f"task.digits must be in 1..6, got {self.digits}")
        if self.num_eval < 1 or self.num_eval > (10**self.digits) ** 2 // 4:
            raise ValueError(f"task.num_eval must be in 1..{(10**self.digits) ** 2 // 4}, got {self.num_eval}")

    @property
    def prompt_length(self) -> int:
        return 2 * self.digits + 2

    @property
    def answer_length(self) -> int:
        return self.digits + 1


def build_tokenizer(save_dir: Path | None = None) -> Any:
    """A real transformers tokenizer over single characters, plus EOS and mask tokens."""
    from dllm_models import char_tokenizer

    return char_tokenizer(ALPHABET, eos=EOS, mask=MASK, save_dir=save_dir)


class AdditionTask:
    """Prompts, answers and the reward of the addition task."""

    def __init__(self, cfg: AdditionConfig, tokenizer: Any) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        n = 10**cfg.digits
        rng = random.Random(cfg.seed)
        held: set[tuple[int, int]] = set()
        while len(held) < cfg.num_eval:
            held.add((rng.randrange(n), rng.randrange(n)))
        self.eval_pairs = sorted(held)
        self._held = held

    def prompt(self, a: int, b: int) -> str:
        d = self.cfg.digits
        return f"{a:0{d}d}+{b:0{d}d}="

    def answer(self, a: int, b: int) -> str:
        return f"{a + b:0{self.cfg.answer_length}d}"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def train_pairs(self, count: int, seed: int) -> list[tuple[int, int]]:
        """`count` training pairs drawn by `seed`, never from the held-out set."""
        rng = random.Random(seed)
        n = 10**self.cfg.digits
        out: list[tuple[int, int]] = []
        while len(out) < count:
            pair = (rng.randrange(n), rng.randrange(n))
            if pair not in self._held:
                out.append(pair)
        return out

    def sft_batch(self, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, response_valid), each [count, prompt + answer length]."""
        rows = [self.encode(self.prompt(a, b) + self.answer(a, b)) for a, b in self.train_pairs(count, seed)]
        ids = torch.tensor(rows, dtype=torch.long)
        response = torch.zeros_like(ids, dtype=torch.bool)
        response[:, self.cfg.prompt_length:] = True
        return ids, torch.ones_like(ids, dtype=torch.bool), response


def exact_match_reward(response: str, answer: str) -> float:
    """1.0 if the response, stripped of whitespace and EOS, equals the answer, else 0.0."""
    return 1.0 if response.replace(EOS, "").strip() == answer.strip() else 0.0
