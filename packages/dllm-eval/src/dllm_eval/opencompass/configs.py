"""OpenCompass configs generated from data: benchmark x preset x decoding, no file per combination.

``build_config(checkpoint, benchmarks, presets, ...)`` writes one local jsonl per benchmark and
preset (the rows of the shipped ``dllm_eval`` data with the preset's instruction applied, so
prompts equal the native runner's) and returns a plain OpenCompass config dict:

- one dataset per (benchmark, preset): ``DLLMJsonlDataset`` on the jsonl (absolute path), a
  prompt template with one ``HUMAN``/``BOT`` item per chat turn (derived from the rows' role
  sequence) plus a sample-index meta item, ``ZeroRetriever``, ``GenInferencer`` and
  ``DLLMRewardEvaluator`` (``dllm_eval`` rewards, offline);
- one ``DLLMModel`` per distinct decoding setting (OpenCompass models carry the decoding, its
  ``dllm_rollout.SamplingConfig`` as a plain dict under ``decoding``, so
  benchmarks of different preset groups, e.g. math 512 and puzzle 256, get different model
  entries), paired with their datasets through ``model_dataset_combinations``;
- ``NaivePartitioner`` + ``LocalRunner`` for inference and evaluation, ``work_dir``.

Types are dotted strings, so :func:`write_config` can dump the dict as a plain Python config
file that OpenCompass loads with ``Config.fromfile``. This module imports no OpenCompass code.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pprint
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from dllm_rollout import SamplingConfig, configure

from dllm_eval.benchmarks import get_benchmark
from dllm_eval.decoding import resolve_decoding
from dllm_eval.presets import get_preset

__all__ = ["DATASET_TYPE", "EVALUATOR_TYPE", "MODEL_TYPE", "build_config", "dataset_abbr",
           "checkpoint_grid", "decoding_for", "model_abbr", "write_config", "write_jsonl"]

MODEL_TYPE = "dllm_eval.opencompass.model.DLLMModel"
DATASET_TYPE = "dllm_eval.opencompass.dataset.DLLMJsonlDataset"
EVALUATOR_TYPE = "dllm_eval.opencompass.evaluator.DLLMRewardEvaluator"
_TURN = "dllm_turn_"  # = dataset.TURN_PREFIX (not imported: that module imports opencompass)
_SAMPLE = "dllm_sample"  # = dataset.SAMPLE_COLUMN
_ANSWER = "ground_truth"
_OC_ROLE = {"user": "HUMAN", "assistant": "BOT", "system": "SYSTEM"}


def dataset_abbr(benchmark: str, preset: str) -> str:
    """OpenCompass dataset name of a benchmark under a preset."""
    return f"{benchmark}-{preset}"


def checkpoint_grid(checkpoint: str | Path | None) -> tuple[str | None, int | None]:
    """(family, native block length) of the checkpoint folder's model, from its config.json (built on the meta
    device, no weights read); (None, None) without a checkpoint."""
    if checkpoint is None:
        return None, None
    return _grid(str(Path(checkpoint).resolve()))


@functools.lru_cache(maxsize=8)
def _grid(folder: str) -> tuple[str | None, int | None]:
    from dllm_models import load_model

    traits: Any = load_model(folder, device="meta").traits
    block: int | None = traits.block_length
    return str(traits.family), block


def decoding_for(benchmark: str, preset: str, overrides: Mapping[str, Any] | None = None, *,
                 checkpoint: str | Path | None = None) -> SamplingConfig:
    """The settings ``benchmark`` decodes with under ``preset`` on ``checkpoint``'s model, with ``overrides``
    (SamplingConfig fields; None values skipped): `dllm_eval.resolve_decoding`, the rule `dare eval` uses."""
    family, block = checkpoint_grid(checkpoint)
    return resolve_decoding(benchmark, preset, family=family, block_length=block, overrides=overrides)


def model_abbr(checkpoint: str | Path, decoding: SamplingConfig) -> str:
    """OpenCompass model name: checkpoint folder name + decoding settings (so two settings never
    share a name)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(checkpoint).resolve().name) or "model"
    abbr = (f"{name}_L{decoding.max_new_tokens}_S{decoding.steps}_B{decoding.block_length}"
            f"_T{decoding.temperature:g}")
    if decoding.remasking != "low_confidence":
        abbr += f"_{decoding.remasking}"
    if decoding.cache:
        abbr += f"_{decoding.cache}"
    if decoding.threshold is not None:
        abbr += f"_th{decoding.threshold:g}"
    named = {"max_new_tokens", "steps", "block_length", "temperature", "remasking", "cache", "threshold"}
    for f in dataclasses.fields(decoding):  # any other setting that differs from its default
        value = getattr(decoding, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name not in named and f.name != "speed" and value != default:  # speed: never what is sampled
            abbr += f"_{f.name}{value}"
    return abbr


def write_jsonl(benchmark: str, preset: str, path: str | Path, *,
                limit: int | None = None) -> list[str]:
    """Write the rows of ``benchmark`` (messages under ``preset``) to ``path``.

    Columns: ``dllm_turn_<i>`` (text of turn i), ``ground_truth``, ``data_source``,
    ``extra_info`` (JSON text), ``index``. Returns the role sequence shared by all rows.
    """
    bench = get_benchmark(benchmark)
    rows = bench.load(limit=limit, preset=preset)
    roles: list[str] | None = None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            msgs = bench.messages(row, preset)
            row_roles = [m["role"] for m in msgs]
            if roles is None:
                roles = row_roles
            elif row_roles != roles:
                raise ValueError(f"{benchmark}: rows have different chat role sequences "
                                 f"({roles} vs {row_roles}); one prompt template cannot fit")
            rec: dict[str, Any] = {f"{_TURN}{i}": m["content"] for i, m in enumerate(msgs)}
            rec.update(ground_truth=row.ground_truth, data_source=row.data_source,
                       extra_info=json.dumps(row.extra_info, sort_keys=True), index=row.index)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if roles is None:
        raise ValueError(f"{benchmark}: no rows (limit={limit})")
    return roles


def _dataset_cfg(benchmark: str, preset: str, jsonl: Path, roles: Sequence[str],
                 decoding: SamplingConfig, score_workers: int) -> dict[str, Any]:
    turns = [{"role": _OC_ROLE[r], "prompt": "{%s%d}" % (_TURN, i)} for i, r in enumerate(roles)]
    meta = {"role": "DLLM_SAMPLE", "prompt": "{%s}" % _SAMPLE}
    return {
        "abbr": dataset_abbr(benchmark, preset),
        "type": DATASET_TYPE,
        "path": str(jsonl.resolve()),
        "reader_cfg": {
            "input_columns": [f"{_TURN}{i}" for i in range(len(roles))] + [_SAMPLE],
            "output_column": _ANSWER,
        },
        "infer_cfg": {
            "prompt_template": {
                "type": "opencompass.openicl.icl_prompt_template.PromptTemplate",
                "template": {"round": [meta, *turns]},
            },
            "retriever": {"type": "opencompass.openicl.icl_retriever.ZeroRetriever"},
            "inferencer": {"type": "opencompass.openicl.icl_inferencer.GenInferencer",
                           "max_out_len": decoding.max_new_tokens},
        },
        "eval_cfg": {
            "evaluator": {"type": EVALUATOR_TYPE, "benchmark": benchmark, "preset": preset,
                          "workers": score_workers},
        },
    }


def build_config(
    checkpoint: str | Path,
    benchmarks: Sequence[str],
    presets: Sequence[str] = ("dare_local",),
    *,
    work_dir: str | Path,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    decoding: Mapping[str, Any] | None = None,
    batch_size: int = 8,
    seed: int | None = 0,
    device: str | None = None,
    dtype: str | None = None,
    num_gpus: int = 0,
    score_workers: int = 4,
) -> dict[str, Any]:
    """An OpenCompass config (plain dict) for ``benchmarks`` x ``presets`` on ``checkpoint``.

    Args:
        checkpoint: checkpoint folder (made absolute).
        benchmarks, presets: ``dllm_eval`` benchmark and preset names (validated).
        work_dir: OpenCompass work dir (made absolute).
        data_dir: where the jsonl files go (default ``<work_dir>/data``).
        limit: first ``limit`` rows of each benchmark.
        decoding: overrides of the preset decoding (``max_new_tokens``, ``steps``, ...).
        batch_size: prompts per ``generate`` call.
        seed: base seed; sample i uses ``seed + i``.
        device, dtype: where/how the model is loaded (default cuda if available / checkpoint's).
        num_gpus: GPUs OpenCompass reserves per inference task.
        score_workers: threads of the reward evaluator.
    """
    if not benchmarks or not presets:
        raise ValueError("need at least one benchmark and one preset")
    for p in presets:
        get_preset(p)
    ckpt = Path(checkpoint).resolve()
    work = Path(work_dir).resolve()
    data = Path(data_dir).resolve() if data_dir is not None else work / "data"
    datasets: list[dict[str, Any]] = []
    models: dict[str, dict[str, Any]] = {}
    combos: dict[str, list[dict[str, Any]]] = {}
    for preset in presets:
        for bench in benchmarks:
            settings = decoding_for(bench, preset, decoding, checkpoint=ckpt)
            jsonl = data / f"{dataset_abbr(bench, preset)}.jsonl"
            roles = write_jsonl(bench, preset, jsonl, limit=limit)
            ds = _dataset_cfg(bench, preset, jsonl, roles, settings, score_workers)
            datasets.append(ds)
            abbr = model_abbr(ckpt, settings)
            if abbr not in models:
                models[abbr] = {
                    "abbr": abbr,
                    "type": MODEL_TYPE,
                    "path": str(ckpt),
                    "decoding": dataclasses.asdict(settings),
                    "seed": seed,
                    "device": device,
                    "dtype": dtype,
                    "max_out_len": settings.max_new_tokens,
                    "batch_size": batch_size,
                    "run_cfg": {"num_gpus": num_gpus, "num_procs": 1},
                }
            combos.setdefault(abbr, []).append(ds)
    runner = {"type": "opencompass.runners.LocalRunner", "max_num_workers": 1}
    return {
        "models": list(models.values()),
        "datasets": datasets,
        "model_dataset_combinations": [
            {"models": [models[a]], "datasets": dss} for a, dss in combos.items()],
        "infer": {
            "partitioner": {"type": "opencompass.partitioners.NaivePartitioner"},
            "runner": {**runner, "task": {"type": "opencompass.tasks.OpenICLInferTask"}},
        },
        "eval": {
            "partitioner": {"type": "opencompass.partitioners.NaivePartitioner"},
            "runner": {**runner, "task": {"type": "opencompass.tasks.OpenICLEvalTask",
                                          "dump_details": True}},
        },
        "work_dir": str(work),
    }


def write_config(config: Mapping[str, Any], path: str | Path) -> Path:
    """Dump ``config`` as a Python config file (one top-level assignment per key)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Generated by dllm_eval.opencompass.configs.build_config; do not edit.", ""]
    for key, value in config.items():
        lines.append(f"{key} = {pprint.pformat(value, width=100, sort_dicts=False)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path
