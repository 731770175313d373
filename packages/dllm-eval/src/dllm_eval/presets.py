"""Evaluation protocols as data: decoding, prompts, subsets and scoring per benchmark group.

Each preset names the file it follows; :data:`PRESETS` holds:

- ``dare_local``: DARE's local bench, ``scripts/eval_local_bench.sh`` (yjyddq/DARE, 83ae8a3):
  the RL trainer in ``val_only`` mode over the RL test parquets, scored by ``dllm_rm``.
- ``d1`` (256 tokens), ``d1_128``, ``d1_512``: d1's evaluation, ``eval/eval.py`` +
  ``eval/{gsm8k,math500,countdown,sudoku}.py`` + ``eval/parse_and_get_acc.py``
  (dllm-reasoning/d1, 837888f); d1 reports all three lengths.
- ``dare_opencompass``: the OpenCompass configs behind DARE's published table,
  ``opencompass/llada_examples/llada_instruct_gen_{gsm8k_length256_block8,
  math_length512_block64, aime2024_length2048_block64}.py`` (yjyddq/DARE, 83ae8a3).

``docs/evaluation.md`` lists, per preset, what matches the followed file and what does not.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Iterable

from dllm_rollout import SamplingConfig, configure

from dllm_eval.data import Message
from dllm_eval.prompts import (
    D1_COUNTDOWN_TEMPLATE,
    D1_GSM8K_PROMPT,
    D1_GSM8K_TEMPLATE,
    D1_MATH500_TEMPLATE,
    D1_SUDOKU_ROWS,
    D1_SUDOKU_TEMPLATE,
    OC_GSM8K_SHOTS,
    OC_GSM8K_TEMPLATE,
    OC_MATH_TEMPLATE,
)

__all__ = ["D1_MATH_SYSTEM_PROMPT", "GROUPS", "PRESETS", "REWARD_MODE_NAMES", "Preset", "did_you_mean",
           "get_preset"]

GROUPS: tuple[str, ...] = ("math", "code", "puzzle")
REWARD_MODE_NAMES: tuple[str, ...] = ("default", "dare", "d1")

D1_MATH_SYSTEM_PROMPT = D1_GSM8K_PROMPT
"""d1's GSM8K instruction (kept under its old name)."""


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A named evaluation protocol.

    Args:
        name: registry key.
        decoding: ``dllm_rollout.SamplingConfig`` per benchmark group (``math``, ``code``,
            ``puzzle``), written for masked-diffusion models (a block model decodes them on its grid: `dllm_eval.resolve_decoding`).
        benchmark_decoding: settings for single benchmarks, overriding their group's.
        family_decoding: per model family (``dream``, ...), fields replaced in the decoding
            settings (e.g. DARE validates Dream at temperature 0.2, top-p 0.95).
        instruction: per group, text prepended to the first user turn (joined by a blank line).
        templates: per benchmark, the text of the (only) user turn, with fields replaced
            literally: ``{question}`` (the stored user prompt), ``{numbers}``, ``{target}``,
            ``{puzzle}``; wins over ``instruction``.
        shots: per benchmark, chat turns placed before the user turn (few-shot examples).
        assistant_prefill: text appended after the chat template's generation prompt.
        raw_decode: decode all generated tokens with special tokens kept (no EOS cut), as d1
            does; rewards then see ``<|eot_id|>`` and padding.
        subsets: per benchmark, the row indices evaluated (in order); absent -> all rows.
        repeats: per benchmark, samples per prompt (accuracy is their mean).
        max_prompt_tokens: per group, prompts longer than this are dropped (and counted in the
            manifest), as verl's ``filter_overlong_prompts``.
        gsm8k_extraction: answer extraction for GSM8K in the default reward mode.
        reward_mode: reward table used for scoring (``default``, ``dare`` or ``d1``).
        source: the file(s) the protocol follows.
        summary: one line saying what the protocol is (for ``dare eval --list``).
    """

    name: str
    decoding: dict[str, SamplingConfig]
    benchmark_decoding: dict[str, SamplingConfig] = field(default_factory=dict)
    family_decoding: dict[str, dict[str, float]] = field(default_factory=dict)
    instruction: dict[str, str] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)
    shots: dict[str, tuple[Message, ...]] = field(default_factory=dict)
    assistant_prefill: str = ""
    raw_decode: bool = False
    subsets: dict[str, tuple[int, ...]] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=dict)
    max_prompt_tokens: dict[str, int] = field(default_factory=dict)
    gsm8k_extraction: str = "boxed"
    reward_mode: str = "default"
    source: str = ""
    summary: str = ""

    def __post_init__(self) -> None:
        missing = set(GROUPS) - set(self.decoding)
        if missing:
            raise ValueError(f"preset {self.name!r} lacks decoding for groups {sorted(missing)}")
        if self.gsm8k_extraction not in ("boxed", "hash", "last_number"):
            raise ValueError(f"gsm8k_extraction={self.gsm8k_extraction!r}; "
                             "use 'boxed', 'hash' or 'last_number'")
        if self.reward_mode not in REWARD_MODE_NAMES:
            raise ValueError(f"reward_mode={self.reward_mode!r}; use one of {REWARD_MODE_NAMES}")
        bad = {k: v for k, v in {**self.repeats, **self.max_prompt_tokens}.items() if v < 1}
        if bad:
            raise ValueError(f"preset {self.name!r}: repeats/max_prompt_tokens must be >= 1, "
                             f"got {bad}")
        for family, fields in self.family_decoding.items():
            unknown = set(fields) - {"temperature", "top_p"}
            if unknown:
                raise ValueError(f"family_decoding[{family!r}] has fields {sorted(unknown)}; "
                                 "only 'temperature' and 'top_p' may vary by family")

    def decoding_for(self, benchmark: str, group: str, family: str | None = None
                     ) -> SamplingConfig:
        """Decoding settings of ``benchmark`` (in ``group``) for a model of ``family``."""
        settings = self.benchmark_decoding.get(benchmark, self.decoding[group])
        return configure(settings, **self.family_decoding.get(family or "", {}))


def _d(length: int, steps: int, block: int, **kw: object) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=length, steps=steps, block_length=block,
                            **kw)  # type: ignore[arg-type]


def _d1(length: int) -> Preset:
    """d1 at one generation length: steps = length / 2, block 32, greedy, no cache."""
    greedy = _d(length, length // 2, 32)
    return Preset(
        name="d1" if length == 256 else f"d1_{length}",
        decoding={"math": greedy, "code": greedy, "puzzle": greedy},
        templates={"gsm8k": D1_GSM8K_TEMPLATE, "math500": D1_MATH500_TEMPLATE,
                   "aime2024": D1_MATH500_TEMPLATE, "aime2025": D1_MATH500_TEMPLATE,
                   "countdown": D1_COUNTDOWN_TEMPLATE, "sudoku": D1_SUDOKU_TEMPLATE},
        assistant_prefill="<reasoning>",
        raw_decode=True,
        subsets={"sudoku": D1_SUDOKU_ROWS},
        gsm8k_extraction="last_number",
        reward_mode="d1",
        summary=f"d1's evaluation at {length} new tokens ({length // 2} steps, block 32, greedy, d1's parsers)",
        source=f"dllm-reasoning/d1 eval/eval.py (gen_length {length}, diffusion_steps "
               f"{length // 2}, block_length 32), eval/gsm8k.py, eval/math500.py, "
               "eval/countdown.py, eval/sudoku.py, eval/parse_and_get_acc.py",
    )


PRESETS: dict[str, Preset] = {
    "dare_local": Preset(
        name="dare_local",
        decoding={"math": _d(512, 512, 32, cache="prefix"),
                  "code": _d(512, 512, 32, cache="prefix"),
                  "puzzle": _d(256, 256, 32, cache="prefix")},
        family_decoding={"dream": {"temperature": 0.2, "top_p": 0.95}},
        max_prompt_tokens={"math": 512, "puzzle": 512, "code": 1024},
        gsm8k_extraction="boxed",
        reward_mode="dare",
        summary="DARE's local bench: 512 new tokens (puzzles 256), block 32, prefix cache, DARE's rewards",
        source="yjyddq/DARE scripts/eval_local_bench.sh (val_only; use_cache=True, "
               "dual_cache=False; val temperature 0, Dream 0.2 with top_p 0.95; "
               "max_prompt_length 512, code 1024, filter_overlong_prompts; dllm_rm reward)",
    ),
    "d1": _d1(256),
    "d1_128": _d1(128),
    "d1_512": _d1(512),
    "dare_opencompass": Preset(
        name="dare_opencompass",
        decoding={"math": _d(512, 512, 64, cache="prefix"),
                  "code": _d(512, 512, 32, cache="prefix"),
                  "puzzle": _d(256, 256, 32, cache="prefix")},
        benchmark_decoding={
            "gsm8k": _d(256, 256, 8, cache="prefix"),
            "aime2024": _d(2048, 2048, 64, temperature=1.0, cache="dual"),
            "aime2025": _d(2048, 2048, 64, temperature=1.0, cache="dual"),
        },
        templates={"gsm8k": OC_GSM8K_TEMPLATE, "math500": OC_MATH_TEMPLATE,
                   "aime2024": OC_MATH_TEMPLATE, "aime2025": OC_MATH_TEMPLATE},
        shots={"gsm8k": OC_GSM8K_SHOTS},
        repeats={"aime2024": 8, "aime2025": 8},
        gsm8k_extraction="last_number",
        reward_mode="default",
        summary="the OpenCompass configs of DARE's published table (GSM8K 4-shot, AIME 8 repeats)",
        source="yjyddq/DARE opencompass/llada_examples/llada_instruct_gen_gsm8k_length256_"
               "block8.py, ..._math_length512_block64.py, ..._aime2024_length2048_block64.py "
               "(datasets gsm8k_gen_1d7fe4, math_0shot_gen_11c4b5, aime2024_gen_repeat8_6e39a4)",
    ),
}
"""Evaluation protocols by name."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the valid names closest to a misspelled ``name``, else ``""``."""
    close = difflib.get_close_matches(name, list(valid), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def get_preset(name: str) -> Preset:
    """The preset called ``name``; unknown names raise ``ValueError`` listing valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}{did_you_mean(name, PRESETS)}; valid: {sorted(PRESETS)}")
    return PRESETS[name]
