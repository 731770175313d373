"""RL recipes on released checkpoints: load the folder, read RL parquet data, train, validate.

The same phases, workers and checkpoints as the quick start; the model comes from
`checkpoint.checkpoint`, prompts and verifiers from `data.train_files` (RL parquet schema,
docs/data.md#rl-parquet, or the name of a test set shipped with dllm_eval), validation from `data.eval_files`
through `dllm_train.benchmark_validator`. The RL phase runs on `trainer.backend` (in process, or
`trainer.num_workers` Ray ranks, see `dare.rl_backend`), resumable on either. The input checks,
model loading, validation and export here are shared with the SFT and preference recipes
(`offline_pipeline`).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dare.algorithms import check_family, family_key
from dare.config import CheckpointRun, RLRecipeConfig, RunConfig
from dare.inputs import (check_block_length, check_checkpoint, check_family_name, check_rl_data, check_rollout_engine,
                         train_file_entries)
from dare.rl_data import rl_prompts
from dare.rl_backend import rl_backend
from dare.run_folder import start_run, writing_run_folder
from dare.sinks import curve_keys, curves_title, open_wandb_run
from dllm_eval import DATASETS, Row, score
from dllm_models import load_model, load_tokenizer, save_model, set_kernels
from dllm_train import (
    PhaseSpec,
    PromptBatch,
    Run,
    benchmark_validator,
    derive_seed,
    plot_curves,
    read_metrics,
    replace_text,
)

logger = logging.getLogger(__name__)


def check_inputs(cfg: CheckpointRun, entry: Any) -> Any:
    """Raise before any work if the checkpoint folder is incomplete (config.json, weights, tokenizer)
    or of another family than `checkpoint.family`, the training data are not set or missing, the
    checkpoint's family (read from config.json, no weights) is not one the algorithm supports, or
    `rollout.block_length` is not a block-diffusion checkpoint's block size. Returns the checkpoint's
    model on the meta device (no weights)."""
    ckpt = cfg.checkpoint
    family = check_checkpoint(ckpt.checkpoint)
    train_file_entries(cfg.data.train_files, names=DATASETS)
    meta: Any = load_model(ckpt.checkpoint, device="meta")
    check_family(cfg.algorithm_name, entry, family_key(meta))
    check_family_name(ckpt.family, family, ckpt.checkpoint)
    check_block_length(cfg.rollout.block_length, meta.traits.block_length, ckpt.checkpoint)
    return meta


def set_num_threads(cfg: RunConfig) -> None:
    """Honour `trainer.num_threads` (torch CPU threads of this process; 0 keeps torch's default)."""
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)


def load_policy(cfg: CheckpointRun, device: str | None = None) -> Any:
    """The checkpoint's model on `device` (default: the GPU when there is one), running the run's
    `kernels` (on every rank: the ranks load it here too)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ckpt = cfg.checkpoint
    return set_kernels(load_model(ckpt.checkpoint, dtype=ckpt.dtype, device=device), cfg.kernels)


def validator(cfg: CheckpointRun, model: Any, tokenizer: Any) -> Callable[[], dict[str, float]] | None:
    """Held-out validation on `data.eval_files` with the recipe's decoding lengths (None: no eval files)."""
    data = cfg.data
    evals = [e.strip() for e in data.eval_files.split(",") if e.strip()]
    if not evals:
        return None
    return benchmark_validator(model, tokenizer, evals, limit=data.eval_max_rows or None, rollout=cfg.rollout)


def finish(cfg: CheckpointRun, output_dir: Path, run: Run, model: Any, tokenizer: Any, *, steps: int,
           curves: Sequence[str], t0: float) -> dict[str, Any]:
    """Export `model/` (LoRA adapters merged into a copy, and alone in PEFT's format under
    `adapter/`), plot the curves, write summary.json."""
    run.close()
    export = model
    ckpt = cfg.checkpoint
    if ckpt.lora_rank:
        from dllm_models.lora import merge_lora, save_peft_adapter

        save_peft_adapter(model, output_dir / "adapter", base_model=ckpt.checkpoint)
        export = merge_lora(copy.deepcopy(model))
    # the release's generation_config.json (its stop ids and sampling defaults) travels with the export
    gen = Path(ckpt.checkpoint) / "generation_config.json"
    extra = {gen.name: gen.read_text()} if gen.is_file() else None
    save_model(export, output_dir / "model", tokenizer=tokenizer, extra_files=extra)
    records = read_metrics(output_dir / "metrics.jsonl")
    plot_curves(records, curve_keys(records, curves), output_dir / "curves.png",
                title=curves_title(cfg, output_dir, records))
    summary = {"recipe": cfg.recipe, "algorithm": cfg.algorithm_name, "steps": steps, "results": run.results,
               "wall_time_s_this_invocation": round(time.perf_counter() - t0, 1)}
    replace_text(output_dir / "summary.json", json.dumps(summary, indent=2))  # never through a link
    return summary


@dataclass(frozen=True)
class RowReward:
    """The verifier of the RL data rows, by row key (picklable: every Ray rank scores with a copy)."""

    rows: dict[str, Row]

    def __call__(self, text: str, key: str) -> float:
        row = self.rows[key]
        return score(row.data_source, text, row.ground_truth, row.extra_info)


def detokenizer(tokenizer: Any) -> Callable[[list[int]], str]:
    """Token ids -> text without special tokens (what the verifiers read)."""
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))


def policy_with_adapters(cfg: CheckpointRun, device: str | None = None) -> Any:
    """`load_policy` plus the LoRA adapters of `checkpoint.lora_*` (drawn from the trainer seed): the one place
    every kind of run (RL, SFT, preference) applies them."""
    model = load_policy(cfg, device)
    lora = cfg.checkpoint.lora()
    if lora is not None:
        lora.apply(model, seed=cfg.trainer.seed)
    return model


def driver_device(cfg: CheckpointRun) -> str | None:
    """Where the driver keeps its copy of the policy (None: the GPU when there is one).

    On the Ray backend the ranks train and decode; the driver's copy only receives their weights
    for checkpoints, the export and validation. Without validation (`data.eval_files` empty) it
    stays on the CPU, so it takes no GPU memory beside rank 0.
    """
    if cfg.trainer.backend == "ray" and not cfg.data.eval_files.strip():
        return "cpu"
    return None


def rank_setup(cfg: RLRecipeConfig, reward: RowReward, run_dir: str | None = None) -> Any:
    """One Ray rank of an RL recipe (module-level, so Ray pickles it by reference): the initial
    policy read from the checkpoint folder on the rank (a resumed run's weights come later, from
    `RayRLWorkflow.load_state`), so no weights travel from the driver."""
    from dllm_train.distributed import RankSetup

    return RankSetup(model=policy_with_adapters(cfg, "cpu"), sampling=cfg.rollout, reward_fn=reward,
                     detokenize=detokenizer(load_tokenizer(cfg.checkpoint.checkpoint)),
                     algorithm=cfg.algorithm, optim=cfg.rl_optim, trainer=cfg.trainer,
                     engine_folder=cfg.checkpoint.checkpoint, run_dir=run_dir)


def _rl_inputs(cfg: RLRecipeConfig) -> tuple[Any, list[tuple[list[int], Row]]]:
    """The tokenizer and the encoded prompts of an RL recipe, every input checked before anything is
    written or the model loads."""
    meta = check_inputs(cfg, cfg.algorithm)
    check_rollout_engine(cfg.rollout, meta, cfg.algorithm, cfg.checkpoint.checkpoint)
    check_rl_data(cfg.data.train_files, names=DATASETS)
    tokenizer = load_tokenizer(cfg.checkpoint.checkpoint)
    return tokenizer, rl_prompts(cfg, tokenizer)


def run_rl_recipe(cfg: RLRecipeConfig, output_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) an RL recipe on `trainer.backend` (local, or Ray ranks); returns the summary it writes."""
    tokenizer, data = _rl_inputs(cfg)
    t0 = time.perf_counter()
    set_num_threads(cfg)
    rl = cfg.rl
    with writing_run_folder(cfg, output_dir):  # every input check passed: the first write
        wandb_run = open_wandb_run(cfg, output_dir)
        model = policy_with_adapters(cfg, driver_device(cfg))
        reward = RowReward({str(i): row for i, (_, row) in enumerate(data)})
        seed = cfg.trainer.seed

        def prompts(step: int) -> PromptBatch:
            g = torch.Generator().manual_seed(derive_seed(seed, "rl-data", step))
            pick = torch.randint(len(data), (rl.prompts_per_step,), generator=g).tolist()
            return PromptBatch([data[i][0] for i in pick], [str(i) for i in pick], rl.group_size)

        step_fn, owner, shutdown = rl_backend(  # before `Run` loads a resumed checkpoint into `model`
            cfg, model, prompts=prompts, algorithm=cfg.algorithm,
            reward_fn=reward, detokenize=detokenizer(tokenizer),
            rank_setup=functools.partial(rank_setup, cfg, reward, str(output_dir)), output_dir=output_dir)
        validate = validator(cfg, model, tokenizer)
        run = start_run(output_dir, model, cfg.trainer, tokenizer=tokenizer, progress=progress,
                               wandb_run=wandb_run)
        try:
            run.run_phase(PhaseSpec(
                order=0, name="rl", steps=cfg.trainer.max_steps, step_fn=step_fn, owner=owner,
                eval_fn=validate, eval_every=cfg.trainer.eval_every, save_every=cfg.trainer.save_every,
                on_end=(lambda: {"final_eval": validate()}) if validate is not None else None,
                log_keys=("reward_mean", "loss", "clip_frac", "response_length"),
            ))
        finally:
            shutdown()
        return finish(cfg, output_dir, run, model, tokenizer, steps=cfg.trainer.max_steps,
                      curves=("reward_mean", "response_length", "loss", "clip_frac"), t0=t0)
