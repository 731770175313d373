"""Evaluation protocols as data: decoding settings and prompt conventions per benchmark group.

Two presets side by side:

- ``dare_local``: DARE's "local bench" (``scripts/eval_local_bench.sh``: the RL trainer in
  ``val_only`` mode over the RL test parquets with ``dllm_rm``): response length 512 for math
  and code, 256 for countdown/sudoku, block 32, steps = response length, temperature 0 (LLaDA;
  Dream used 0.2), prompts exactly as in the parquets (no system prompt), GSM8K scored on the
  last ``\\boxed{}``.
- ``d1``: the d1 paper's evaluation (dllm-reasoning/d1 ``eval/``): a math-expert instruction
  asking for ``<reasoning>``/``<answer>`` with a boxed final answer is prepended to the math
  questions, generation length 256 with steps = length / 2, block 32, temperature 0,
  low-confidence remasking. Countdown/Sudoku prompts already carry d1's format preamble.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["D1_MATH_SYSTEM_PROMPT", "PRESETS", "DecodingSettings", "Preset", "get_preset"]

Remasking = Literal["low_confidence", "random"]


@dataclass(frozen=True, kw_only=True)
class DecodingSettings:
    """Arguments of the generation call (units in names; ``steps`` = total denoising steps)."""

    max_new_tokens: int
    steps: int
    block_length: int
    temperature: float = 0.0
    remasking: Remasking = "low_confidence"
    threshold: float | None = None
    cache: str | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0 or self.steps <= 0 or self.block_length <= 0:
            raise ValueError(
                "max_new_tokens, steps and block_length must be > 0, got "
                f"{self.max_new_tokens}, {self.steps}, {self.block_length}"
            )
        if self.max_new_tokens % self.block_length:
            raise ValueError(
                f"max_new_tokens={self.max_new_tokens} must be a multiple of "
                f"block_length={self.block_length}"
            )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(
                f"remasking={self.remasking!r}; use 'low_confidence' or 'random'"
            )
        if self.threshold is not None and not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1] or None, got {self.threshold}")


D1_MATH_SYSTEM_PROMPT = (
    "You are a math expert. You will be given a question to solve. Solve it step by step. "
    "Wrap the final answer in a \\boxed{}. \n"
    "Respond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n"
    "<answer>\n\\boxed{...}\n</answer>"
)


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A named evaluation protocol.

    Args:
        name: registry key.
        decoding: settings per benchmark group (``math``, ``code``, ``puzzle``).
        instruction: per group, text prepended to the first user turn (joined by a blank
            line), or absent for the prompt as stored.
        gsm8k_extraction: answer extraction used for GSM8K (``boxed``/``hash``/``last_number``).
        source: where the protocol comes from.
    """

    name: str
    decoding: dict[str, DecodingSettings]
    instruction: dict[str, str] = field(default_factory=dict)
    gsm8k_extraction: str = "boxed"
    source: str = ""

    def __post_init__(self) -> None:
        missing = {"math", "code", "puzzle"} - set(self.decoding)
        if missing:
            raise ValueError(f"preset {self.name!r} lacks decoding for groups {sorted(missing)}")
        if self.gsm8k_extraction not in ("boxed", "hash", "last_number"):
            raise ValueError(f"gsm8k_extraction={self.gsm8k_extraction!r}; "
                             "use 'boxed', 'hash' or 'last_number'")


def _greedy(length: int, steps: int | None = None) -> DecodingSettings:
    return DecodingSettings(max_new_tokens=length, steps=steps or length, block_length=32)


PRESETS: dict[str, Preset] = {
    "dare_local": Preset(
        name="dare_local",
        decoding={"math": _greedy(512), "code": _greedy(512), "puzzle": _greedy(256)},
        gsm8k_extraction="boxed",
        source="DARE scripts/eval_local_bench.sh (spec section 6.2)",
    ),
    "d1": Preset(
        name="d1",
        decoding={"math": _greedy(256, 128), "code": _greedy(256, 128),
                  "puzzle": _greedy(256, 128)},
        instruction={"math": D1_MATH_SYSTEM_PROMPT},
        gsm8k_extraction="last_number",
        source="d1 paper evaluation (dllm-reasoning/d1 eval/, gen length 256, steps 128)",
    ),
}
"""Evaluation protocols by name."""


def get_preset(name: str) -> Preset:
    """The preset called ``name``; unknown names raise ``ValueError`` listing valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {sorted(PRESETS)}")
    return PRESETS[name]
