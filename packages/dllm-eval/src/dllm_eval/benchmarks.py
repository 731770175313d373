"""Benchmark definitions: shipped test rows, prompt builder, reward and decoding group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dllm_eval.data import Message, Row, load_rows
from dllm_eval.presets import DecodingSettings, Preset, get_preset
from dllm_eval.rewards import RewardResult, compute_reward

__all__ = ["BENCHMARKS", "Benchmark", "get_benchmark"]

Group = Literal["math", "code", "puzzle"]


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    """One benchmark: which rows, which reward, which decoding group.

    Args:
        name: registry key, also the shipped dataset name.
        data_source: reward router key (:data:`dllm_eval.REWARDS`).
        group: decoding group in presets (``math``, ``code`` or ``puzzle``).
        licence: licence of the underlying data.
    """

    name: str
    data_source: str
    group: Group
    licence: str

    def __post_init__(self) -> None:
        if self.group not in ("math", "code", "puzzle"):
            raise ValueError(f"group={self.group!r}; use 'math', 'code' or 'puzzle'")

    def load(self, *, limit: int | None = None) -> list[Row]:
        """Test rows from the package data (first ``limit`` rows if given)."""
        return load_rows(self.name, limit=limit)

    def messages(self, row: Row, preset: Preset | str = "dare_local") -> list[Message]:
        """Chat messages for ``row`` under ``preset`` (instruction prepended to the user turn)."""
        p = get_preset(preset) if isinstance(preset, str) else preset
        msgs = [dict(m) for m in row.prompt]
        instruction = p.instruction.get(self.group)
        if instruction:
            first_user = next(i for i, m in enumerate(msgs) if m["role"] == "user")
            msgs[first_user]["content"] = f"{instruction}\n\n{msgs[first_user]['content']}"
        return msgs

    def decoding(self, preset: Preset | str = "dare_local") -> DecodingSettings:
        """Default decoding settings of this benchmark under ``preset``."""
        p = get_preset(preset) if isinstance(preset, str) else preset
        return p.decoding[self.group]

    def reward(self, response: str, row: Row, preset: Preset | str = "dare_local") -> RewardResult:
        """Score one response to ``row`` (GSM8K extraction taken from the preset)."""
        p = get_preset(preset) if isinstance(preset, str) else preset
        extra = dict(row.extra_info)
        if self.data_source == "gsm8k":
            extra["gsm8k_extraction"] = p.gsm8k_extraction
        return compute_reward(self.data_source, response, row.ground_truth, extra)


_MIT = "MIT"
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(name="gsm8k", data_source="gsm8k", group="math", licence=_MIT),
        Benchmark(name="math500", data_source="math500", group="math", licence=_MIT),
        Benchmark(name="aime2024", data_source="aime2024", group="math",
                  licence="public competition problems"),
        Benchmark(name="aime2025", data_source="aime2025", group="math",
                  licence="public competition problems"),
        Benchmark(name="countdown", data_source="countdown", group="puzzle",
                  licence="generated"),
        Benchmark(name="sudoku", data_source="sudoku", group="puzzle", licence="generated"),
        Benchmark(name="humaneval", data_source="humaneval", group="code", licence=_MIT),
        Benchmark(name="humanevalplus", data_source="humanevalplus", group="code",
                  licence="Apache-2.0 (EvalPlus) over MIT (HumanEval)"),
        Benchmark(name="mbpp", data_source="mbpp", group="code", licence="CC-BY-4.0"),
    )
}
"""Benchmarks by name."""


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called ``name``; unknown names raise ``ValueError`` listing valid ones."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; valid: {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]
