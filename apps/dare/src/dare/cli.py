"""The `dare` command: train, eval, recipes, show, runs, compare."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dare.algorithms import describe
from dare.compare import add_compare_parser
from dare.config import PreferenceRecipeConfig, QuickstartConfig, RLRecipeConfig, RunConfig, SFTRecipeConfig, load_config
from dare.evaluate import add_eval_parser
from dare.inputs import check_eval_inputs
from dare.recipes import RECIPE_DOCS, RECIPES, get_recipe, resolve
from dare.run_folder import check_run_folder, config_change_allowed, legacy_checkpoints_trusted
from dare.runs import add_runs_parser


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


def _pipeline(cfg: RunConfig) -> Callable[..., dict[str, Any]]:
    """The pipeline of a checkpoint recipe's kind: `run_rl_recipe`, `run_sft_recipe` or `run_preference_recipe`."""
    if isinstance(cfg, RLRecipeConfig):
        from dare.pipeline import run_rl_recipe

        return run_rl_recipe
    from dare.offline_pipeline import run_preference_recipe, run_sft_recipe

    if isinstance(cfg, SFTRecipeConfig):
        return run_sft_recipe
    assert isinstance(cfg, PreferenceRecipeConfig), type(cfg)  # the last of `dare.config.KINDS`
    return run_preference_recipe


def _resolved(args: argparse.Namespace) -> RunConfig:
    """The run config of `args`: `--config FILE` or the recipe, with the dotted overrides applied."""
    if args.config and args.recipe:
        raise ValueError(f"pass either a recipe ({args.recipe!r}) or --config {args.config}, not both")
    cfg = _config_file(Path(args.config)) if args.config else get_recipe(args.recipe or "quickstart")
    return resolve(cfg, args.overrides)  # `task=<task>`: DARE's per-task settings


def _train(args: argparse.Namespace) -> int:
    cfg = _resolved(args)
    out = Path(args.output_dir) if args.output_dir else Path("runs") / f"{cfg.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    with config_change_allowed(args.allow_config_change), legacy_checkpoints_trusted(args.trust_legacy_checkpoint):
        check_run_folder(cfg, out)  # a different run in the folder is refused before any work
        args.resolved_output_dir = str(out)  # for the resume hint of an interrupted run
        logging.getLogger(__name__).info("output folder: %s", out)
        if not isinstance(cfg, QuickstartConfig):
            summary = _pipeline(cfg)(cfg, out, progress=not args.no_progress)
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
    list_recipes()
    return 0


def list_recipes() -> None:
    """Print the recipes and the algorithms (`dare recipes`; `dare.recipe_index` keeps a copy of the text)."""
    width = max(map(len, RECIPES))  # one column however long a name is
    for name in RECIPES:
        print(f"{name:{width}s}  {RECIPE_DOCS[name]}")
    print("\nalgorithms:")
    algorithms = describe()
    width = max(map(len, algorithms))
    for name, doc in algorithms.items():
        print(f"  {name:{width}s}  {doc}")


def _show(args: argparse.Namespace) -> int:
    from dare.show import describe_config

    cfg = _resolved(args)
    if args.train_help:
        print(_train_arguments(argparse.ArgumentParser(prog="dare train", description=_TRAIN)).format_help())
    print(describe_config(cfg, RECIPE_DOCS.get(cfg.recipe, "")))
    return 0


def _config_file(path: Path) -> RunConfig:
    """The run config of `--config path`; a missing, unreadable or malformed file is one ValueError naming it."""
    try:
        return load_config(path)
    except OSError as err:
        raise ValueError(f"--config {path}: cannot read it ({err.strerror or err}); pass the config.json of "
                         "an earlier run folder") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--config {path}: not JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                         "pass the config.json of an earlier run folder") from None


_TRAIN = "Run a recipe (default: the CPU quick start). `dare train RECIPE --help` also lists the recipe's fields."


def _train_arguments(train: argparse.ArgumentParser) -> argparse.ArgumentParser:
    train.add_argument("recipe", nargs="?", help="a recipe of `dare recipes` (default: quickstart)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.max_steps=10 algorithm.mc_num=4")
    train.add_argument("--output-dir", help="run folder (default runs/<recipe>-<time>); rerun to resume")
    train.add_argument("--config", help="a resolved config.json from an earlier run")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--allow-config-change", action="store_true",
                       help="resume a run folder although the config differs in fields that must not change")
    train.add_argument("--trust-legacy-checkpoint", action="store_true",
                       help="resume from a checkpoint without manifest.json (written before manifests); "
                            "only for a run folder you wrote yourself")
    return train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dare", description="Post-train and evaluate diffusion LLMs.")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    train = _train_arguments(sub.add_parser("train", help="run a recipe (default: the CPU quick start)",
                                            description=_TRAIN))
    train.set_defaults(func=_train)
    add_eval_parser(sub)
    rec = sub.add_parser("recipes", help="list recipes and algorithms")
    rec.set_defaults(func=_recipes)
    show = sub.add_parser("show", help="every field of a recipe's config, with its value and doc")
    show.add_argument("recipe", nargs="?", help="a recipe of `dare recipes` (default: quickstart)")
    show.add_argument("overrides", nargs="*", help="dotted overrides applied first, e.g. algorithm=bgpo")
    show.add_argument("--config", help="a resolved config.json from an earlier run")
    show.set_defaults(func=_show, train_help=False)
    add_runs_parser(sub)
    add_compare_parser(sub)
    return parser


def _recipe_help(words: list[str]) -> list[str] | None:
    """`train RECIPE ... --help` -> the words of `show RECIPE ...` (None: no recipe help asked)."""
    if words[:1] != ["train"] or not {"-h", "--help"} & set(words):
        return None
    rest = [w for w in words[1:] if w not in ("-h", "--help", "--no-progress", "--allow-config-change",
                                                 "--trust-legacy-checkpoint")]
    if "--output-dir" in rest:
        del rest[rest.index("--output-dir"): rest.index("--output-dir") + 2]
    rest = [w for w in rest if not w.startswith("--output-dir=")]
    named = [w for w in rest if not w.startswith("-") and "=" not in w]
    return ["show", *rest] if named or "--config" in rest else None


def _parse(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """`words` parsed, the dotted overrides of `train` and `show` accepted anywhere (after an option too)."""
    args, extra = parser.parse_known_args(words)
    if args.command in ("train", "show"):
        if args.recipe and "=" in args.recipe:
            args.overrides = [args.recipe, *args.overrides]
            args.recipe = None
        args.overrides += [w for w in extra if "=" in w and not w.startswith("-")]
        extra = [w for w in extra if w not in args.overrides]
    if extra:
        also = "; overrides are dotted key=value words, e.g. sft.steps=1" if args.command in ("train", "show") else ""
        parser.error(f"unrecognized arguments: {' '.join(extra)} (options: `dare {args.command} --help`{also})")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    lead = words[:1] if words[:1] in (["-v"], ["--verbose"]) else []
    show_words = _recipe_help(words[len(lead):])  # `train RECIPE --help`: the options and the recipe's fields
    args = _parse(parser, [*lead, *show_words] if show_words is not None else words)
    if show_words is not None:
        args.train_help = True
    _setup_logging(args.verbose)
    from dare.algorithms import PLUGIN_ERRORS

    if PLUGIN_ERRORS:
        parser.exit(2, f"dare: error: {PLUGIN_ERRORS[0]}\n")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        if args.command == "eval":
            check_eval_inputs(args.checkpoint, args.output_dir, harness=args.harness)
        code: int = args.func(args)
    except KeyboardInterrupt as err:  # SIGINT, or SIGTERM during a phase (dllm_train.Interrupted): 128 + signal
        for signum in (signal.SIGINT, signal.SIGTERM):  # on the way out: the copy `uv run` forwards is no traceback
            signal.signal(signum, signal.SIG_IGN)
        parser.exit(getattr(err, "exit_code", 130), f"dare: interrupted. {_resume_hint(args, argv)}\n")
    except (ValueError, OSError) as err:  # user errors: bad config, missing or unreadable files
        if args.verbose or (isinstance(err, OSError) and not isinstance(err, ValueError) and err.filename is None):
            raise  # an OSError without a file name is no user error: keep its traceback
        parser.exit(2, f"dare: error: {err}\n")
    except RuntimeError as err:
        if not _is_out_of_memory(err) or args.verbose:
            raise
        parser.exit(1, f"dare: error: out of GPU memory ({str(err).splitlines()[0][:200]}).\n{OOM_HINT}\n")
    return code


OOM_HINT = ("A step needs less memory with: trainer.max_tokens_per_pass=N (tokens per likelihood forward), "
            "rollout.max_rows=N (rows decoded at once), trainer.activation_checkpointing=true, or fewer "
            "prompts per step (rl.prompts_per_step, sft.batch_size, preference.pairs_per_step); "
            "more GPUs: trainer.backend=ray trainer.num_workers=N. The run folder resumes from its last checkpoint.")


def _is_out_of_memory(err: BaseException) -> bool:
    """A CUDA out-of-memory error, raised here or on a Ray rank (wrapped, so matched by its text)."""
    import torch

    return isinstance(err, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in str(err)


def _resume_hint(args: argparse.Namespace, argv: list[str] | None) -> str:
    """One line saying whether the run can be resumed, with the exact command to do it."""
    out = getattr(args, "resolved_output_dir", None)
    if args.command != "train" or out is None:
        return "Nothing to resume."
    words = list(sys.argv[1:] if argv is None else argv)
    if "--output-dir" not in words and not any(w.startswith("--output-dir=") for w in words):
        words += ["--output-dir", out]
    prog = f"uv run {sys.argv[0]}" if Path(sys.argv[0]).is_dir() else "dare"
    from dllm_train import latest_checkpoint

    ref = latest_checkpoint(Path(out))
    if ref is None:
        return f"No checkpoint was written in {out}; rerunning starts the run over: {prog} {shlex.join(words)}"
    return f"The run in {out} resumes from its checkpoint {ref.path.name}: {prog} {shlex.join(words)}"
