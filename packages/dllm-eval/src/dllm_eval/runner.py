"""Native benchmark runner: batch prompts, generate, decode, score, write outputs + manifest."""

from __future__ import annotations

import dataclasses
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

from dllm_eval.benchmarks import Benchmark, get_benchmark
from dllm_eval.data import Message, Row
from dllm_eval.manifest import build_manifest
from dllm_eval.presets import DecodingSettings, Preset, get_preset

__all__ = ["BenchmarkResult", "ChatTokenizer", "GenerateFn", "SampleResult", "render_table",
           "run_benchmark"]

logger = logging.getLogger(__name__)

GenerateFn = Callable[..., Any]
"""``generate(model, prompts: list[list[int]], *, max_new_tokens, steps, block_length,
temperature, remasking, cache, threshold, seed)`` returning an object with ``.response_ids``
(LongTensor ``[B, max_new_tokens]``), as ``dllm_rollout.generate``."""


class ChatTokenizer(Protocol):
    """The tokenizer surface the runner uses (a Hugging Face tokenizer satisfies it)."""

    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True, kw_only=True)
class SampleResult:
    """One scored sample (one line of ``samples.jsonl``)."""

    index: int
    data_source: str
    prompt_tokens: int
    response: str
    pred: str | None
    score: float
    acc: float
    ground_truth: str


@dataclass(frozen=True, kw_only=True)
class BenchmarkResult:
    """Scores of one benchmark run, its samples and its manifest."""

    benchmark: str
    preset: str
    samples: tuple[SampleResult, ...]
    manifest: dict[str, Any]

    @property
    def mean_score(self) -> float:
        """Mean reward (partial credit included)."""
        return sum(s.score for s in self.samples) / max(1, len(self.samples))

    @property
    def accuracy(self) -> float:
        """Fraction of fully correct samples."""
        return sum(s.acc for s in self.samples) / max(1, len(self.samples))

    def table(self) -> str:
        """A one-row results table (see :func:`render_table`)."""
        return render_table([self])


def render_table(results: Sequence[BenchmarkResult]) -> str:
    """Markdown table: benchmark, preset, n, accuracy (%) and mean score (%)."""
    lines = ["| benchmark | preset | n | accuracy | mean score |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.benchmark} | {r.preset} | {len(r.samples)} | "
                     f"{100 * r.accuracy:.2f} | {100 * r.mean_score:.2f} |")
    return "\n".join(lines)


def _default_generate() -> GenerateFn:
    from dllm_rollout import generate  # type: ignore[attr-defined,unused-ignore]

    return generate  # type: ignore[no-any-return,unused-ignore]


def _encode(tokenizer: ChatTokenizer, messages: list[Message]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if isinstance(out, torch.Tensor):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


def _eos_ids(tokenizer: ChatTokenizer) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in eos} if isinstance(eos, (list, tuple, set)) else {int(eos)}


def _decode(tokenizer: ChatTokenizer, ids: Sequence[int], eos: set[int]) -> str:
    cut = next((i for i, t in enumerate(ids) if t in eos), len(ids))
    return tokenizer.decode(list(ids[:cut]), skip_special_tokens=True).strip()


def _write(output_dir: Path, result: BenchmarkResult) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / "samples.jsonl", "w", encoding="utf-8") as f:
        for s in result.samples:
            f.write(json.dumps(dataclasses.asdict(s), ensure_ascii=False) + "\n")
    (output_dir / "manifest.json").write_text(json.dumps(result.manifest, indent=2, default=str))
    (output_dir / "results.md").write_text(result.table() + "\n")


def run_benchmark(
    model: Any,
    tokenizer: ChatTokenizer,
    benchmark: Benchmark | str,
    *,
    preset: Preset | str = "dare_local",
    batch_size: int = 8,
    limit: int | None = None,
    seed: int | None = 0,
    output_dir: str | Path | None = None,
    generate_fn: GenerateFn | None = None,
    decoding: DecodingSettings | None = None,
    score_workers: int = 4,
    hash_weights: bool = True,
) -> BenchmarkResult:
    """Generate and score a benchmark; optionally write ``samples.jsonl`` + ``manifest.json``.

    Prompts are rendered with the tokenizer's chat template (``add_generation_prompt=True``),
    batched ``batch_size`` at a time, generated with ``generate_fn`` (default
    ``dllm_rollout.generate``), cut at the first EOS id, decoded with
    ``skip_special_tokens=True`` and scored with the benchmark's reward. With greedy decoding
    (temperature 0) and a generator that treats samples independently, scores do not depend
    on ``batch_size``; for sampling, each sample gets its own seed ``seed + row index`` (a list
    of per-sample seeds, as ``dllm_rollout.generate`` accepts), so it is batch-invariant too.

    Args:
        model: the model handed to ``generate_fn``.
        tokenizer: see :class:`ChatTokenizer`.
        benchmark: a :class:`Benchmark` or its name.
        preset: protocol preset or its name (prompt instruction, decoding, GSM8K extraction).
        batch_size: prompts per generation call.
        limit: evaluate only the first ``limit`` rows.
        seed: base seed; sample ``i`` is generated with ``seed + i`` (None = unseeded).
        output_dir: where to write outputs; nothing is written when None.
        generate_fn: generation function (see :data:`GenerateFn`).
        decoding: overrides the preset's decoding settings for this benchmark.
        score_workers: threads used for scoring (code rewards run in the sandbox).
        hash_weights: include the SHA-256 of the weights in the manifest.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    bench = get_benchmark(benchmark) if isinstance(benchmark, str) else benchmark
    pre = get_preset(preset) if isinstance(preset, str) else preset
    settings = decoding or bench.decoding(pre)
    gen = generate_fn or _default_generate()
    rows: list[Row] = bench.load(limit=limit)
    prompts = [_encode(tokenizer, bench.messages(row, pre)) for row in rows]
    eos = _eos_ids(tokenizer)
    responses: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        seeds = None if seed is None else [seed + r.index for r in rows[start:start + batch_size]]
        out = gen(model, batch, max_new_tokens=settings.max_new_tokens, steps=settings.steps,
                  block_length=settings.block_length, temperature=settings.temperature,
                  remasking=settings.remasking, cache=settings.cache,
                  threshold=settings.threshold, seed=seeds)
        ids = out.response_ids.tolist()
        responses += [_decode(tokenizer, r, eos) for r in ids]
        logger.info("%s: generated %d/%d", bench.name, len(responses), len(prompts))
    with ThreadPoolExecutor(max_workers=max(1, score_workers)) as pool:
        rewards = list(pool.map(lambda rr: bench.reward(rr[0], rr[1], pre), zip(responses, rows)))
    samples = tuple(
        SampleResult(index=row.index, data_source=row.data_source, prompt_tokens=len(p),
                     response=resp, pred=rw.pred, score=rw.score, acc=rw.acc,
                     ground_truth=row.ground_truth)
        for row, p, resp, rw in zip(rows, prompts, responses, rewards)
    )
    manifest = build_manifest(
        benchmark=bench.name, preset=pre.name, decoding=dataclasses.asdict(settings),
        eos_handling="response cut at the first EOS id "
                     f"{sorted(eos)}; decoded with skip_special_tokens=True; stripped",
        prompts=prompts, chat_template=getattr(tokenizer, "chat_template", None),
        model=model, seed=seed, batch_size=batch_size, limit=limit, hash_weights=hash_weights,
    )
    manifest["instruction"] = pre.instruction.get(bench.group)
    manifest["gsm8k_extraction"] = pre.gsm8k_extraction
    result = BenchmarkResult(benchmark=bench.name, preset=pre.name, samples=samples,
                             manifest=manifest)
    if output_dir is not None:
        _write(Path(output_dir), result)
    return result
