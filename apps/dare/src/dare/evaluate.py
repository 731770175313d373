"""`dare eval`: benchmarks on a checkpoint, natively or through OpenCompass."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def catalogue() -> str:
    """`dare eval --list`: every benchmark and preset, one line each with what it is."""
    from dllm_eval import BENCHMARKS, PRESETS

    lines = ["benchmarks:"]
    lines += [f"  {b.name:18s} {b.group:7s} {b.summary}" for b in BENCHMARKS.values()]
    lines += ["", "presets (--preset):"]
    lines += [f"  {p.name:18s} {p.summary}" for p in PRESETS.values()]
    return "\n".join(lines)


class _ListAction(argparse.Action):
    """`--list`: print the catalogue and exit, before the checkpoint argument is required."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(catalogue())
        parser.exit(0)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def check_eval_args(args: argparse.Namespace) -> None:
    """Raise `ValueError` for any bad `dare eval` argument, before a model is loaded: benchmarks,
    presets, reward modes (with "did you mean" for a near miss), `--limit`, `--batch-size` and
    the decoding overrides."""
    from dllm_eval import REWARD_MODES, get_benchmark, get_preset
    from dllm_eval.presets import did_you_mean

    if not _names(args.benchmarks):
        raise ValueError("--benchmarks is empty; pass names such as --benchmarks gsm8k,math500 (see dare eval --list)")
    if not _names(args.preset):
        raise ValueError("--preset is empty; pass one such as --preset dare_local (see dare eval --list)")
    for name in _names(args.benchmarks):
        try:
            get_benchmark(name)
        except ValueError as err:
            raise ValueError(f"--benchmarks: {err}") from None
    for name in _names(args.preset):
        try:
            get_preset(name)
        except ValueError as err:
            raise ValueError(f"--preset: {err}") from None
    for mode in _names(args.reward_mode or ""):
        if mode not in REWARD_MODES:
            raise ValueError(f"--reward-mode {mode!r} unknown{did_you_mean(mode, REWARD_MODES)}; "
                             f"valid: {sorted(REWARD_MODES)}")
    for flag, value in (("--limit", args.limit), ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens), ("--steps", args.steps),
                        ("--block-length", args.block_length)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}" + (
                " (leave --limit out to evaluate every row)" if flag == "--limit" else ""))
    if args.max_new_tokens is not None and args.block_length is not None and args.max_new_tokens % args.block_length:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} must be a multiple of --block-length "
                         f"{args.block_length}")
    speed_settings(args)  # a bad FIELD=VALUE raises here, before a model loads
    if args.harness != "native" and (getattr(args, "speed", None) or getattr(args, "kernels", None)):
        raise ValueError("--speed and --kernels set how the native decoder and model run; drop them with "
                         "--harness opencompass")


def speed_settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """(SpeedConfig, KernelConfig) of `--speed FIELD=VALUE` and `--kernels FIELD=VALUE` (the defaults
    where none is given), validated: a field or value error names the flag."""
    from dare.config_tree import apply_tree, parse_overrides
    from dllm_models import KernelConfig
    from dllm_rollout import SpeedConfig

    out: list[Any] = []
    for flag, base in (("speed", SpeedConfig()), ("kernels", KernelConfig())):
        items = getattr(args, flag, None) or []
        try:
            out.append(apply_tree(base, parse_overrides(items), f"{flag}.") if items else base)
        except ValueError as err:
            raise ValueError(f"--{flag}: {err}") from None
    return out[0], out[1]


def _overrides(args: argparse.Namespace) -> dict[str, int]:
    """The SamplingConfig fields `--max-new-tokens`, `--steps` and `--block-length` set (both harnesses)."""
    flags = {"max_new_tokens": args.max_new_tokens, "steps": args.steps, "block_length": args.block_length}
    return {k: v for k, v in flags.items() if v is not None}


def add_eval_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("eval", help="evaluate a checkpoint on benchmarks")
    p.add_argument("checkpoint", help="checkpoint folder (config.json, safetensors, tokenizer files)")
    p.add_argument("--list", action=_ListAction, nargs=0, help="list the benchmarks and presets, then exit")
    p.add_argument("--adapter", default=None,
                   help="a LoRA adapter folder in PEFT's format (a LoRA run's adapter/) applied to the checkpoint")
    p.add_argument("--benchmarks", default="gsm8k", help="comma-separated names (see dare eval --list)")
    p.add_argument("--preset", default="dare_local",
                   help="protocol preset(s), comma-separated to compare protocols side by side (see dare eval --list)")
    p.add_argument("--reward-mode", default=None,
                   help="reward table(s), comma-separated to report them side by side: default (ours), "
                        "dare (DARE's verl rules), d1 (d1's parsers); default: each preset's own")
    p.add_argument("--harness", default="native", choices=("native", "opencompass"))
    p.add_argument("--engine", default="native", choices=("native", "lmdeploy"),
                   help="who decodes: the native decoder, or lmdeploy's PyTorch engine (block-diffusion "
                        "models; needs the dllm-rollout[lmdeploy] extra)")
    p.add_argument("--limit", type=int, default=None, help="first N rows of each benchmark")
    p.add_argument("--batch-size", type=int, default=None,
                   help="prompts decoded together (default 64 on CUDA, 8 on CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the preset")
    p.add_argument("--steps", type=int, default=None, help="override the preset")
    p.add_argument("--block-length", type=int, default=None, help="override the preset")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 (default: the checkpoint's)")
    p.add_argument("--output-dir", default=None, help="default runs/eval-<time>")
    p.add_argument("--speed", action="append", default=[], metavar="FIELD=VALUE",
                   help="how the native decoder runs (dllm_rollout.SpeedConfig, e.g. cuda_graphs=false, "
                        "retire_rows=0); repeatable; recorded in each manifest's decoding.speed")
    p.add_argument("--kernels", action="append", default=[], metavar="FIELD=VALUE",
                   help="how the model's forward runs (dllm_models.KernelConfig, e.g. decode_span=false); "
                        "repeatable; recorded in each manifest's kernels")
    p.set_defaults(func=run_eval)


def new_eval_folder(root: Path = Path("runs")) -> Path:
    """A new folder `root/eval-<time>` (`-1`, `-2`... when taken): created here, so two evaluations
    started in the same second get two folders (`mkdir` is atomic)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        path = root / (f"eval-{stamp}-{n}" if n else f"eval-{stamp}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise ValueError(f"{root} holds 10000 evaluation folders of {stamp}; pass --output-dir")


def run_eval(args: argparse.Namespace) -> int:
    """`dare eval`: the output folder is locked for the evaluation (one writer, as a run folder)."""
    check_eval_args(args)  # before anything is loaded
    from dare.run_folder import check_no_symlinks, lock_run_folder, release_run_folder

    out = Path(args.output_dir) if args.output_dir else new_eval_folder()
    check_no_symlinks(out)
    out.mkdir(parents=True, exist_ok=True)
    lock_run_folder(out)  # a second `dare eval` into the folder is refused while this one writes it
    try:
        return _evaluate(args, out)
    finally:
        release_run_folder(out)


def _evaluate(args: argparse.Namespace, out: Path) -> int:
    names = _names(args.benchmarks)
    if args.batch_size is None:
        args.batch_size = 64 if str(args.device).startswith("cuda") else 8
    presets = _names(args.preset)
    modes = _names(args.reward_mode or "")
    if args.adapter is not None and args.harness != "native":
        raise ValueError("--adapter works with the native harness only; drop --harness opencompass")
    if args.adapter is not None and getattr(args, "engine", "native") != "native":
        raise ValueError(f"--adapter works with the native engine only (--engine {args.engine} decodes the "
                         "checkpoint folder's own weights); drop --engine, or evaluate the run's merged model/")
    if args.harness == "opencompass":
        from dllm_eval.opencompass.driver import run_opencompass

        return run_opencompass(args.checkpoint, names, preset=presets, limit=args.limit, output_dir=out,
                               seed=args.seed, decoding=_overrides(args))
    from dllm_eval import (get_benchmark, get_preset, infer_family, render_table, rescore, resolve_decoding,
                           run_benchmark, weights_fingerprint, write_result)
    from dllm_models import load_model, load_tokenizer, set_kernels

    if args.adapter is not None:
        from dllm_models.lora import check_peft_adapter

        check_peft_adapter(args.adapter)
    speed, kernels = speed_settings(args)
    t_load = time.perf_counter()
    model = set_kernels(load_model(args.checkpoint, dtype=args.dtype, device=args.device), kernels)
    if args.adapter is not None:
        from dllm_models.lora import load_peft_adapter

        model = load_peft_adapter(model, args.adapter)
    tokenizer = load_tokenizer(args.checkpoint)
    family = infer_family(model)
    t_print = time.perf_counter()
    fingerprint = weights_fingerprint(model)  # once per model, on its device: every benchmark's manifest
    named = f"{args.checkpoint} with the LoRA adapter {args.adapter}" if args.adapter is not None else args.checkpoint
    logger.info("model %s loaded in %.1f s, weights fingerprinted in %.1f s", named, t_print - t_load,
                time.perf_counter() - t_print)
    extra = {"adapter": str(args.adapter)} if args.adapter is not None else {}
    from dare.engine_eval import engine_generate

    engine_fn = engine_generate(args.engine, args.checkpoint, model)
    results = []
    block: int | None = getattr(model.traits, "block_length", None)
    for preset_name, name in [(p, n) for p in presets for n in names]:
        preset = get_preset(preset_name)
        bench = get_benchmark(name)
        decoding = resolve_decoding(bench, preset, family=family, block_length=block,
                                    overrides={**_overrides(args), "speed": speed})
        from dare.inputs import eval_prompt_warnings

        for warning in eval_prompt_warnings(model, tokenizer, bench, preset, decoding.max_new_tokens, limit=args.limit):
            logger.warning("warning: %s", warning)
        t0 = time.perf_counter()
        sub = out / name if len(presets) == 1 else out / preset_name / name
        result = run_benchmark(model, tokenizer, bench, preset=preset, batch_size=args.batch_size,
                               limit=args.limit, seed=args.seed, output_dir=sub, decoding=decoding,
                               reward_mode=modes[0] if modes else None, family=family, generate_fn=engine_fn,
                               fingerprint=fingerprint)
        if extra:
            result.manifest.update(extra)
            write_result(sub, result)
        logger.info("%s: %d samples in %.1f s", name, len(result.samples), time.perf_counter() - t0)
        results.append(result)
        for mode in modes[1:]:  # same responses, another reward table
            other = rescore(result, mode)
            write_result(sub / f"reward-{mode}", other)
            results.append(other)
    if engine_fn is not None:
        engine_fn.close()
    table = render_table(results)
    (out / "results.md").write_text(table + "\n")
    print(table)
    print(f"per-sample outputs and manifests in {out}")
    return 0
