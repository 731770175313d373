"""`dare eval`: benchmarks on a checkpoint, natively or through OpenCompass."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def add_eval_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("eval", help="evaluate a checkpoint on benchmarks")
    p.add_argument("checkpoint", help="checkpoint folder (config.json, safetensors, tokenizer files)")
    p.add_argument("--benchmarks", default="gsm8k", help="comma-separated names (see dllm_eval.BENCHMARKS)")
    p.add_argument("--preset", default="dare_local",
                   help="protocol preset(s), comma-separated to compare protocols side by side (see dllm_eval.PRESETS)")
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
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    out = Path(args.output_dir) if args.output_dir else Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    names = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    if args.batch_size is None:
        args.batch_size = 64 if str(args.device).startswith("cuda") else 8
    if args.batch_size < 1:
        raise SystemExit(f"dare eval: --batch-size must be >= 1, got {args.batch_size}")
    presets = [p.strip() for p in args.preset.split(",") if p.strip()]
    modes = [m.strip() for m in (args.reward_mode or "").split(",") if m.strip()]
    if args.harness == "opencompass":
        from dllm_eval.opencompass.driver import run_opencompass

        return run_opencompass(args.checkpoint, names, preset=presets, limit=args.limit, output_dir=out)
    from dllm_eval import (REWARD_MODES, get_benchmark, get_preset, infer_family, render_table, rescore,
                           run_benchmark, write_result)
    from dllm_eval.presets import for_model
    from dllm_models import load_model, load_tokenizer

    unknown = [m for m in modes if m not in REWARD_MODES]
    if unknown:
        raise ValueError(f"--reward-mode {','.join(unknown)} unknown; valid: {sorted(REWARD_MODES)}")
    model = load_model(args.checkpoint, dtype=args.dtype, device=args.device)
    tokenizer = load_tokenizer(args.checkpoint)
    family = infer_family(model)
    from dare.engine_eval import engine_generate

    engine_fn = engine_generate(args.engine, args.checkpoint, model)
    results = []
    for preset_name, name in [(p, n) for p in presets for n in names]:
        preset = get_preset(preset_name)
        bench = get_benchmark(name)
        block: int | None = getattr(model.traits, "block_length", None)
        decoding = for_model(bench.decoding(preset, family), block)
        overrides = {k: v for k, v in (("max_new_tokens", args.max_new_tokens), ("steps", args.steps),
                                       ("block_length", args.block_length)) if v is not None}
        if overrides:
            decoding = dataclasses.replace(decoding, **overrides)
        from dare.inputs import eval_prompt_warnings

        for warning in eval_prompt_warnings(model, tokenizer, bench, preset, decoding.max_new_tokens, limit=args.limit):
            logger.warning("warning: %s", warning)
        t0 = time.perf_counter()
        sub = out / name if len(presets) == 1 else out / preset_name / name
        result = run_benchmark(model, tokenizer, bench, preset=preset, batch_size=args.batch_size,
                               limit=args.limit, seed=args.seed, output_dir=sub, decoding=decoding,
                               reward_mode=modes[0] if modes else None, family=family, generate_fn=engine_fn)
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
