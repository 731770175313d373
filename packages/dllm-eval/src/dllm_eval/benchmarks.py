"""Benchmark definitions: shipped test rows, prompt builder, reward and decoding group."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from dllm_rollout import SamplingConfig

from dllm_eval.data import Message, Row, load_rows
from dllm_eval.presets import Preset, did_you_mean, get_preset
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
        summary: one line saying what the benchmark asks (for ``dare eval --list``).
    """

    name: str
    data_source: str
    group: Group
    licence: str
    summary: str = ""

    def __post_init__(self) -> None:
        if self.group not in ("math", "code", "puzzle"):
            raise ValueError(f"group={self.group!r}; use 'math', 'code' or 'puzzle'")

    def load(self, *, limit: int | None = None, preset: Preset | str | None = None) -> list[Row]:
        """Test rows from the package data: the preset's subset if it has one (in its order),
        else all rows; then the first ``limit``."""
        p = _preset(preset) if preset is not None else None
        subset = p.subsets.get(self.name) if p is not None else None
        if subset is None:
            return load_rows(self.name, limit=limit)
        rows = load_rows(self.name)
        picked = [rows[i] for i in subset]
        return picked if limit is None else picked[:limit]

    def messages(self, row: Row, preset: Preset | str = "dare_local") -> list[Message]:
        """Chat messages for ``row`` under ``preset``.

        A preset template for this benchmark replaces the user turn (fields filled from the
        row), else the group's instruction is prepended to the first user turn; preset shots
        (few-shot turns) come first.
        """
        p = _preset(preset)
        msgs = [dict(m) for m in row.prompt]
        first_user = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        template = p.templates.get(self.name)
        instruction = p.instruction.get(self.group)
        if template is not None:
            msgs = [{"role": "user", "content": _fill(template, row, msgs[first_user]["content"])}]
        elif instruction:
            msgs[first_user]["content"] = f"{instruction}\n\n{msgs[first_user]['content']}"
        return [dict(m) for m in p.shots.get(self.name, ())] + msgs

    def decoding(self, preset: Preset | str = "dare_local", family: str | None = None
                 ) -> SamplingConfig:
        """Decoding settings of this benchmark under ``preset`` for a model ``family``."""
        return _preset(preset).decoding_for(self.name, self.group, family)

    def reward(self, response: str, row: Row, preset: Preset | str = "dare_local",
               *, mode: str | None = None) -> RewardResult:
        """Score one response to ``row`` in reward ``mode`` (default: the preset's mode; GSM8K
        extraction of the default mode taken from the preset)."""
        p = _preset(preset)
        extra = dict(row.extra_info)
        if self.data_source == "gsm8k":
            extra["gsm8k_extraction"] = p.gsm8k_extraction
        return compute_reward(self.data_source, response, row.ground_truth, extra,
                              mode=mode or p.reward_mode)


def _preset(preset: Preset | str) -> Preset:
    return get_preset(preset) if isinstance(preset, str) else preset


def _fill(template: str, row: Row, question: str) -> str:
    """Fill a preset template's fields from ``row`` (see :class:`Preset`)."""
    fields = {"{question}": question, "{target}": row.ground_truth}
    if "numbers" in row.extra_info:
        numbers = row.extra_info["numbers"]
        nums = json.loads(numbers) if isinstance(numbers, str) else list(numbers)
        fields["{numbers}"] = str([int(n) for n in nums])
    if "puzzle" in row.extra_info:
        fields["{puzzle}"] = str(row.extra_info["puzzle"])
    out = template
    for key, value in fields.items():
        out = out.replace(key, value)
    missing = [f for f in ("{numbers}", "{puzzle}") if f in out]
    if missing:
        raise ValueError(f"template fields {missing} have no value in row {row.index} "
                         f"(extra_info keys: {sorted(row.extra_info)})")
    return out


_MIT = "MIT"
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(name="gsm8k", data_source="gsm8k", group="math", licence=_MIT,
                  summary="grade-school math word problems (GSM8K test split)"),
        Benchmark(name="math500", data_source="math500", group="math", licence=_MIT,
                  summary="competition math, 500 problems of the MATH test set"),
        Benchmark(name="aime2024", data_source="aime2024", group="math",
                  licence="public competition problems",
                  summary="AIME 2024 competition problems (integer answers)"),
        Benchmark(name="aime2025", data_source="aime2025", group="math",
                  licence="public competition problems",
                  summary="AIME 2025 competition problems (integer answers)"),
        Benchmark(name="countdown", data_source="countdown", group="puzzle",
                  licence="generated",
                  summary="reach a target number from given numbers with + - * /"),
        Benchmark(name="sudoku", data_source="sudoku", group="puzzle", licence="generated",
                  summary="4x4 Sudoku puzzles"),
        Benchmark(name="humaneval", data_source="humaneval", group="code", licence=_MIT,
                  summary="Python functions from docstrings, run against unit tests"),
        Benchmark(name="humanevalplus", data_source="humanevalplus", group="code",
                  licence="Apache-2.0 (EvalPlus) over MIT (HumanEval)",
                  summary="HumanEval with EvalPlus's extra tests"),
        Benchmark(name="mbpp", data_source="mbpp", group="code", licence="CC-BY-4.0",
                  summary="basic Python programming problems, run against unit tests"),
    )
}
"""Benchmarks by name."""


def get_benchmark(name: str) -> Benchmark:
    """The benchmark called ``name``; unknown names raise ``ValueError`` listing valid ones."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}{did_you_mean(name, BENCHMARKS)}; valid: {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]
