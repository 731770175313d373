"""The `dare` command: train, eval, recipes."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dare.algorithms import describe
from dare.config import apply_overrides, load_config
from dare.evaluate import add_eval_parser
from dare.recipes import RECIPES, get_recipe
from dare.run_config_ext import RecipeRunConfig


class _TqdmHandler(logging.Handler):
    """Writes log lines above the progress bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def _setup_logging(verbose: bool) -> None:
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if not verbose else logging.DEBUG)


def _run_recipe(cfg: RecipeRunConfig, out: Path, *, progress: bool) -> dict[str, Any]:
    """Run a checkpoint recipe through the pipeline of its algorithm's kind (RL, SFT, preference)."""
    from dare.algorithms import ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS

    if cfg.algorithm in ALGORITHMS:
        from dare.pipeline import run_rl_recipe

        return run_rl_recipe(cfg, out, progress=progress)
    from dare.offline_pipeline import run_preference_recipe, run_sft_recipe

    if cfg.algorithm in SFT_ALGORITHMS:
        return run_sft_recipe(cfg, out, progress=progress)
    if cfg.algorithm in PREFERENCE_ALGORITHMS:
        return run_preference_recipe(cfg, out, progress=progress)
    raise ValueError(f"algorithm {cfg.algorithm!r} is unknown; choose one of "
                     f"{sorted([*ALGORITHMS, *SFT_ALGORITHMS, *PREFERENCE_ALGORITHMS])}")


def _train(args: argparse.Namespace) -> int:
    if args.config:
        cfg = load_config(Path(args.config))
    else:
        cfg = get_recipe(args.recipe or "quickstart")
    cfg = apply_overrides(cfg, args.overrides)
    out = Path(args.output_dir) if args.output_dir else Path("runs") / f"{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    logging.getLogger(__name__).info("output folder: %s", out)
    if isinstance(cfg, RecipeRunConfig):
        summary = _run_recipe(cfg, out, progress=not args.no_progress)
        print(f"finished {summary['steps']} steps; outputs in {out}")
        return 0
    from dare.quickstart import run_quickstart

    summary = run_quickstart(cfg, out, progress=not args.no_progress)
    print(
        f"held-out accuracy: after SFT {summary['eval_accuracy_before_rl']:.3f} -> "
        f"after RL {summary['eval_accuracy_after_rl']:.3f} on {summary['num_eval_prompts']} prompts; "
        f"outputs in {out}"
    )
    return 0


def _recipes(args: argparse.Namespace) -> int:
    for name, fn in RECIPES.items():
        print(f"{name:20s} {(fn.__doc__ or '').strip().splitlines()[0]}")
    print("\nalgorithms:")
    for name, doc in describe().items():
        print(f"  {name:18s} {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dare", description="Post-train and evaluate diffusion LLMs.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run a recipe (default: the CPU quick start)")
    train.add_argument("recipe", nargs="?", help=f"one of {sorted(RECIPES)}")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.max_steps=10")
    train.add_argument("--output-dir", help="run folder (default runs/<recipe>-<time>); rerun to resume")
    train.add_argument("--config", help="a resolved config.json from an earlier run")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=_train)
    add_eval_parser(sub)
    rec = sub.add_parser("recipes", help="list recipes and algorithms")
    rec.set_defaults(func=_recipes)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train" and args.recipe and "=" in args.recipe:
        args.overrides = [args.recipe, *args.overrides]
        args.recipe = None
    _setup_logging(args.verbose)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        code: int = args.func(args)
    except ValueError as err:
        parser.exit(2, f"dare: error: {err}\n")
    return code
