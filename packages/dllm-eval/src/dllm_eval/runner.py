"""Native benchmark runner: batch prompts, generate, decode, score, write outputs + manifest."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import torch
from dllm_rollout import SamplingConfig, generate, on_model_grid

from dllm_eval.benchmarks import Benchmark, get_benchmark
from dllm_eval.data import Message, Row
from dllm_eval.decoding import resolve_decoding
from dllm_eval.manifest import build_manifest
from dllm_eval.presets import Preset, get_preset

__all__ = ["BenchmarkResult", "ChatTokenizer", "GenerateFn", "SampleResult", "infer_family",
           "render_table", "rescore", "run_benchmark", "write_result"]

logger = logging.getLogger(__name__)


class GenerateFn(Protocol):
    """A generation function, as ``dllm_rollout.generate``: ``generate(model, prompts, cfg,
    seed=seeds)`` returns an object with ``.response_ids`` (LongTensor ``[B, cfg.max_new_tokens]``)."""

    def __call__(self, model: Any, prompts: list[list[int]], cfg: SamplingConfig, *,
                 seed: list[int] | None) -> Any: ...


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
    weight: float = 1.0
    repeat: int = 0


def _weighted(values: Sequence[tuple[float, float]]) -> float:
    total = sum(w for _, w in values)
    return sum(v * w for v, w in values) / total if total else 0.0


@dataclass(frozen=True, kw_only=True)
class BenchmarkResult:
    """Scores of one benchmark run, its samples and its manifest."""

    benchmark: str
    preset: str
    samples: tuple[SampleResult, ...]
    manifest: dict[str, Any]
    reward_mode: str = "default"

    @property
    def mean_score(self) -> float:
        """Mean reward (partial credit included), weighted by the samples' weights."""
        return _weighted([(s.score, s.weight) for s in self.samples])

    @property
    def accuracy(self) -> float:
        """Mean ``acc``, weighted by the samples' weights (1 except e.g. d1 Sudoku cells)."""
        return _weighted([(s.acc, s.weight) for s in self.samples])

    def table(self) -> str:
        """A one-row results table (see :func:`render_table`)."""
        return render_table([self])


def render_table(results: Sequence[BenchmarkResult]) -> str:
    """Markdown table: benchmark, preset, reward mode, n, accuracy (%) and mean score (%)."""
    lines = ["| benchmark | preset | reward | n | accuracy | mean score |",
             "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.benchmark} | {r.preset} | {r.reward_mode} | {len(r.samples)} | "
                     f"{100 * r.accuracy:.2f} | {100 * r.mean_score:.2f} |")
    return "\n".join(lines)


def infer_family(model: Any) -> str | None:
    """Canonical model family name (``dllm_models.registry.FAMILIES``) of ``model``.

    A dllm_models model reports it in ``model.traits.family``. Only a model without traits (a
    transformers module) falls back to its config's ``model_type`` (the registry's spellings,
    then a substring of ``llada2``, ``llada``, ``dream``, ``sdar``) and then its class name.

    Returns:
        The family name, or None when a model without traits matches none.
    """
    family = getattr(getattr(model, "traits", None), "family", None)
    if isinstance(family, str):
        return family
    from dllm_models.registry import MODEL_TYPES

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if isinstance(model_type, str) and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    for candidate in (model_type, type(model).__name__):
        if isinstance(candidate, str):
            low = candidate.lower()
            for name in ("llada2", "llada", "dream", "sdar"):
                if name in low:
                    return name
    return None


def _ids(out: Any) -> list[int]:
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if isinstance(out, torch.Tensor):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


def _encode(tokenizer: ChatTokenizer, messages: list[Message], prefill: str = "") -> list[int]:
    ids = _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    if prefill:
        encode = getattr(tokenizer, "encode", None)
        if encode is None:
            raise TypeError("the preset pre-fills the assistant turn, so the tokenizer needs "
                            "encode(text, add_special_tokens=False); a Hugging Face tokenizer "
                            "has it")
        ids += _ids(encode(prefill, add_special_tokens=False))
    return ids


def _eos_ids(tokenizer: ChatTokenizer, model: Any = None) -> set[int]:
    """The ids a response is cut at: the tokenizer's EOS and the model's stop ids
    (`DiffusionTraits.stop_ids`: SDAR chat models end a turn with `<|im_end|>`)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = set() if eos is None else {int(e) for e in eos} if isinstance(eos, (list, tuple, set)) else {int(eos)}
    return ids | {int(t) for t in getattr(getattr(model, "traits", None), "stop_ids", ())}


def _decode(tokenizer: ChatTokenizer, ids: Sequence[int], eos: set[int], raw: bool = False) -> str:
    if raw:
        return tokenizer.decode(list(ids), skip_special_tokens=False)
    cut = next((i for i, t in enumerate(ids) if t in eos), len(ids))
    return tokenizer.decode(list(ids[:cut]), skip_special_tokens=True).strip()


def write_result(output_dir: str | Path, result: BenchmarkResult) -> None:
    """Write ``samples.jsonl``, ``manifest.json`` and ``results.md`` of ``result``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / "samples.jsonl", "w", encoding="utf-8") as f:
        for s in result.samples:
            f.write(json.dumps(dataclasses.asdict(s), ensure_ascii=False) + "\n")
    (output_dir / "manifest.json").write_text(json.dumps(result.manifest, indent=2, default=str))
    (output_dir / "results.md").write_text(result.table() + "\n")


def _score(bench: Benchmark, pre: Preset, mode: str, rows: Sequence[Row],
           responses: Sequence[str], workers: int) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda rr: bench.reward(rr[0], rr[1], pre, mode=mode),
                             zip(responses, rows)))


def rescore(result: BenchmarkResult, mode: str, *, score_workers: int = 4) -> BenchmarkResult:
    """The same responses scored in another reward ``mode`` (rows looked up by index)."""
    bench = get_benchmark(result.benchmark)
    pre = get_preset(result.preset)
    by_index = {r.index: r for r in bench.load()}
    rows = [by_index[s.index] for s in result.samples]
    rewards = _score(bench, pre, mode, rows, [s.response for s in result.samples], score_workers)
    samples = tuple(dataclasses.replace(s, pred=rw.pred, score=rw.score, acc=rw.acc,
                                        weight=rw.weight)
                    for s, rw in zip(result.samples, rewards))
    return BenchmarkResult(benchmark=result.benchmark, preset=result.preset, samples=samples,
                           manifest={**result.manifest, "reward_mode": mode}, reward_mode=mode)


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
    decoding: SamplingConfig | None = None,
    score_workers: int = 4,
    hash_weights: bool = True,
    reward_mode: str | None = None,
    family: str | None = None,
    filter_overlong: bool = True,
    fingerprint: str | None = None,
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
        decoding: the decoding settings (``dllm_rollout.SamplingConfig``) for this benchmark,
            instead of the preset's (:func:`dllm_eval.resolve_decoding`, which a block model
            decodes on its grid); either way moved onto a block model's grid
            (``dllm_rollout.on_model_grid``).
        score_workers: threads used for scoring (code rewards run in the sandbox).
        hash_weights: include the weights' fingerprint in the manifest
            (:func:`dllm_eval.manifest.weights_fingerprint`, computed on the model's device).
        fingerprint: that fingerprint, when the caller took it already (once per model for
            several benchmarks); None computes it here when ``hash_weights``.
        reward_mode: reward table (``default``, ``dare``, ``d1``); None = the preset's.
        family: model family for the preset's per-family decoding; None = inferred from the
            model (:func:`infer_family`).
        filter_overlong: drop prompts over the preset's ``max_prompt_tokens`` (False keeps every
            row, as the OpenCompass path does).

    The preset also decides the rows (its subset), the prompt (template, shots, assistant
    pre-fill), which prompts are dropped as too long, repeats per prompt and how responses are
    decoded (``raw_decode``: all tokens, special tokens kept); see :class:`Preset`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    bench = get_benchmark(benchmark) if isinstance(benchmark, str) else benchmark
    pre = get_preset(preset) if isinstance(preset, str) else preset
    mode = reward_mode or pre.reward_mode
    fam = family or infer_family(model)
    block = getattr(getattr(model, "traits", None), "block_length", None)
    settings = (resolve_decoding(bench, pre, family=fam, block_length=block) if decoding is None
                else on_model_grid(decoding, block, convert=True))
    gen: GenerateFn = generate_fn or generate
    all_rows: list[Row] = bench.load(limit=limit, preset=pre)
    encoded = [_encode(tokenizer, bench.messages(row, pre), pre.assistant_prefill)
               for row in all_rows]
    max_prompt = pre.max_prompt_tokens.get(bench.group) if filter_overlong else None
    keep = [i for i, p in enumerate(encoded) if max_prompt is None or len(p) <= max_prompt]
    repeats = pre.repeats.get(bench.name, 1)
    rows = [all_rows[i] for i in keep for _ in range(repeats)]
    prompts = [encoded[i] for i in keep for _ in range(repeats)]
    rep_ids = [r for _ in keep for r in range(repeats)]
    eos = _eos_ids(tokenizer, model)
    responses: list[str] = []
    generate_s, generated = 0.0, 0
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        seeds = None if seed is None else [
            seed + row.index * repeats + rep
            for row, rep in zip(rows[start:start + batch_size], rep_ids[start:start + batch_size])]
        t0 = time.perf_counter()
        out = gen(model, batch, settings, seed=seeds)
        ids = out.response_ids.tolist()  # waits for the device
        generate_s += time.perf_counter() - t0
        mask = getattr(out, "response_mask", None)  # the contract promises response_ids only
        generated += int(mask.sum()) if mask is not None else sum(len(r) for r in ids)
        responses += [_decode(tokenizer, r, eos, pre.raw_decode) for r in ids]
        logger.info("%s: generated %d/%d", bench.name, len(responses), len(prompts))
    rewards = _score(bench, pre, mode, rows, responses, score_workers)
    samples = tuple(
        SampleResult(index=row.index, data_source=row.data_source, prompt_tokens=len(p),
                     response=resp, pred=rw.pred, score=rw.score, acc=rw.acc,
                     ground_truth=row.ground_truth, weight=rw.weight, repeat=rep)
        for row, p, resp, rw, rep in zip(rows, prompts, responses, rewards, rep_ids)
    )
    eos_handling = ("all generated tokens decoded with skip_special_tokens=False (d1)"
                    if pre.raw_decode else "response cut at the first EOS id "
                    f"{sorted(eos)}; decoded with skip_special_tokens=True; stripped")
    manifest = build_manifest(
        benchmark=bench.name, preset=pre.name, decoding=dataclasses.asdict(settings),
        eos_handling=eos_handling, prompts=prompts,
        chat_template=getattr(tokenizer, "chat_template", None), model=model, seed=seed,
        batch_size=batch_size, limit=limit, hash_weights=hash_weights,
        fingerprint=fingerprint,
    )
    manifest.update({
        "reward_mode": mode,
        "model_family": fam,
        "instruction": pre.templates.get(bench.name) or pre.instruction.get(bench.group),
        "assistant_prefill": pre.assistant_prefill,
        "gsm8k_extraction": pre.gsm8k_extraction,
        "subset": list(pre.subsets[bench.name]) if bench.name in pre.subsets else None,
        "repeats": repeats,
        "max_prompt_tokens": max_prompt,
        "num_dropped_overlong": len(all_rows) - len(keep),
        "preset_source": pre.source,
        "generate_s": round(generate_s, 3),
        "generated_tokens": generated,
    })
    result = BenchmarkResult(benchmark=bench.name, preset=pre.name, samples=samples,
                             manifest=manifest, reward_mode=mode)
    if output_dir is not None:
        write_result(output_dir, result)
    return result
