"""``python -m dllm_eval.opencompass.run``: evaluate a checkpoint with OpenCompass, offline.

Runs inside the ``envs/opencompass`` environment (normally started by
:func:`dllm_eval.opencompass.driver.run_opencompass`)::

    python -m dllm_eval.opencompass.run --checkpoint DIR --benchmarks gsm8k math500 \\
        --preset dare_local --limit 100 --output-dir runs/oc

Writes under ``--output-dir``: ``config.py`` (the generated OpenCompass config), ``data/``
(jsonl per benchmark x preset), ``opencompass/<timestamp>/`` (OpenCompass's predictions,
results, summary and logs), ``results.md`` + ``results.json`` (one row per benchmark x
preset) and ``manifest.json`` (per-run manifest as the native runner's, plus the OpenCompass
version, command and settings). Exit code 0 when every benchmark produced a score.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from dllm_eval.opencompass.configs import (
    build_config,
    dataset_abbr,
    decoding_for,
    model_abbr,
    write_config,
)
from dllm_eval.opencompass.driver import DECODING_FLAGS

__all__ = ["main", "parse_args"]

logger = logging.getLogger("dllm_eval.opencompass")

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_EVALUATE_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dllm_eval.opencompass.run",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="checkpoint folder")
    p.add_argument("--benchmarks", nargs="+", required=True, help="dllm_eval benchmark names")
    p.add_argument("--preset", nargs="+", default=["dare_local"], help="preset name(s)")
    p.add_argument("--limit", type=int, default=None, help="first N rows of each benchmark")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default=None, help="default: the checkpoint's torch_dtype")
    p.add_argument("--score-workers", type=int, default=4)
    g = p.add_argument_group("decoding overrides (default: the preset's)")
    g.add_argument("--max-new-tokens", type=int)
    g.add_argument("--steps", type=int)
    g.add_argument("--block-length", type=int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--remasking")
    g.add_argument("--cache", choices=["prefix", "dual"])
    g.add_argument("--threshold", type=float)
    p.add_argument("--no-hash-weights", action="store_true",
                   help="skip the weights SHA-256 in the manifest")
    return p.parse_args(argv)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in DECODING_FLAGS if getattr(args, k) is not None}


def _run_opencompass(config_path: Path, work_dir: Path) -> None:
    """OpenCompass's CLI, in this process (``--debug``: tasks run sequentially in-process)."""
    from opencompass.cli.main import main as oc_main  # type: ignore[import-not-found,unused-ignore]

    argv = sys.argv
    cwd = os.getcwd()
    os.chdir(work_dir)  # LocalRunner writes tmp/ into the working directory
    try:
        sys.argv = ["opencompass", str(config_path), "-w", str(work_dir), "--debug"]
        oc_main()
    finally:
        sys.argv = argv
        os.chdir(cwd)


def _latest_run(work_dir: Path) -> Path:
    runs = sorted(p for p in work_dir.iterdir() if p.is_dir() and p.name[:1].isdigit())
    if not runs:
        raise FileNotFoundError(f"OpenCompass wrote no run folder under {work_dir}")
    return runs[-1]


def _manifests(args: argparse.Namespace, presets: Sequence[str],
               overrides: dict[str, Any]) -> dict[str, Any]:
    """Native-runner manifests (prompt hash over the same token ids the model saw, ...)."""
    from dllm_eval.benchmarks import get_benchmark
    from dllm_eval.manifest import build_manifest, weights_hash
    from dllm_eval.opencompass.chat import encode_messages, has_chat_template
    from dllm_eval.opencompass.model import loaded_models
    from dllm_eval.presets import get_preset

    model_obj = loaded_models().get(str(Path(args.checkpoint).resolve()))
    tokenizer = model_obj.tokenizer if model_obj is not None else None
    model = model_obj.model if model_obj is not None else None
    if tokenizer is None:
        from dllm_models import load_tokenizer

        tokenizer = load_tokenizer(args.checkpoint)
    if model is None and not args.no_hash_weights:
        from dllm_models import load_model

        model = load_model(args.checkpoint, device="cpu")
    out: dict[str, Any] = {}
    hashed: dict[str, Any] = {}
    for preset in presets:
        for name in args.benchmarks:
            bench = get_benchmark(name)
            rows = bench.load(limit=args.limit)
            prompts = [encode_messages(tokenizer, bench.messages(r, preset)) for r in rows]
            settings = decoding_for(name, preset, overrides, checkpoint=args.checkpoint)
            m = build_manifest(
                benchmark=name, preset=preset, decoding=dataclasses.asdict(settings),
                eos_handling=("response cut at the first EOS id; decoded with "
                              "skip_special_tokens=True; stripped; cut at stop strings"),
                prompts=prompts, chat_template=getattr(tokenizer, "chat_template", None),
                model=model, seed=args.seed, batch_size=args.batch_size, limit=args.limit,
                hash_weights=False,
            )
            if model is not None and not args.no_hash_weights:
                if "weights" not in hashed:
                    hashed["weights"] = weights_hash(model)
                m["weights_sha256"] = hashed["weights"]
            m["prompt_rendering"] = ("chat template, add_generation_prompt=True"
                                     if has_chat_template(tokenizer)
                                     else "raw text (turns joined by newlines)")
            m["instruction"] = get_preset(preset).instruction.get(bench.group)
            m["gsm8k_extraction"] = get_preset(preset).gsm8k_extraction
            out[dataset_abbr(name, preset)] = m
    return out


def _render(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| benchmark | preset | model | n | accuracy | mean score |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['benchmark']} | {r['preset']} | {r['model']} | {r['n']} | "
                     f"{r['accuracy']:.2f} | {r['score']:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # huggingface_hub reads HF_HUB_OFFLINE when first imported (already done by dllm_eval's
    # imports), so the driver sets these in the child's environment; this covers late readers.
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "opencompass"
    work.mkdir(exist_ok=True)
    presets = list(dict.fromkeys(args.preset))
    overrides = _overrides(args)
    import torch

    num_gpus = 1 if (args.device or "").startswith("cuda") or (
        args.device is None and torch.cuda.is_available()) else 0
    config = build_config(
        args.checkpoint, args.benchmarks, presets, work_dir=work, data_dir=out / "data",
        limit=args.limit, decoding=overrides, batch_size=args.batch_size, seed=args.seed,
        device=args.device, dtype=args.dtype, num_gpus=num_gpus,
        score_workers=args.score_workers)
    config_path = write_config(config, out / "config.py")
    logger.info("OpenCompass config written to %s", config_path)

    _run_opencompass(config_path, work)

    run_dir = _latest_run(work)
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    for preset in presets:
        for name in args.benchmarks:
            settings = decoding_for(name, preset, overrides, checkpoint=args.checkpoint)
            m_abbr = model_abbr(args.checkpoint, settings)
            d_abbr = dataset_abbr(name, preset)
            path = run_dir / "results" / m_abbr / f"{d_abbr}.json"
            if not path.is_file():
                missing.append(str(path))
                continue
            res = json.loads(path.read_text())
            if "accuracy" not in res:
                missing.append(f"{path} ({res.get('error', 'no accuracy')})")
                continue
            rows.append({"benchmark": name, "preset": preset, "model": m_abbr,
                         "n": int(res.get("num_samples", 0)),
                         "accuracy": float(res["accuracy"]), "score": float(res["score"]),
                         "decoding": dataclasses.asdict(settings),
                         "results_file": str(path)})
    table = _render(rows)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    import opencompass  # type: ignore[import-not-found,unused-ignore]

    manifest = {
        "harness": "opencompass",
        "opencompass_version": getattr(opencompass, "__version__", None),
        "checkpoint": str(Path(args.checkpoint).resolve()),
        "benchmarks": list(args.benchmarks),
        "presets": presets,
        "limit": args.limit,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "decoding_overrides": overrides,
        "command": [sys.executable, "-m", "dllm_eval.opencompass.run",
                    *(argv if argv is not None else sys.argv[1:])],
        "opencompass_run_dir": str(run_dir),
        "config": str(config_path),
        "runs": _manifests(args, presets, overrides),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    print(table)
    if missing:
        logger.error("no score for: %s", "; ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
