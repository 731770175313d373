"""SFT and preference recipes on released checkpoints: fixed data in, a trained model folder out.

The same run folder as the RL recipes (`pipeline.py`): `config.json`, `metrics.jsonl` (one line
per optimizer step), atomic checkpoints under `checkpoints/` through `dllm_train.Run`, so a rerun
with the same output folder resumes exactly, `curves.png`, `summary.json` and `model/` (LoRA
adapters merged, as for RL). The data come from `data.train_files` (schemas in `dare.datasets`);
the worker is `dllm_train.OfflineWorker`, training the `SFT_ALGORITHMS` or `PREFERENCE_ALGORITHMS`
entry (an `OfflineObjective`: its masks and its loss).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from dare.algorithms import PREFERENCE_ALGORITHMS, SFT_ALGORITHMS
from dare.config import CheckpointRun, PreferenceRecipeConfig, SFTRecipeConfig
from dare.datasets import (
    encode_preference,
    encode_sft,
    preference_batch,
    read_preference_rows,
    read_sft_rows,
    sft_batch,
    step_indices,
)
from dare.pipeline import check_inputs, finish, policy_with_adapters, set_num_threads, validator
from dare.run_folder import open_run_folder, start_run
from dare.sinks import open_wandb_run
from dare.inputs import config_positions
from dllm_models import load_tokenizer, read_config
from dllm_algorithms import PreferenceBatch
from dllm_train import OfflineWorker, PhaseSpec, resolved_attention, set_activation_checkpointing


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("the checkpoint's tokenizer has neither pad_token nor eos_token; set one in its "
                         "tokenizer_config.json")
    return int(pad)


def _check(cfg: CheckpointRun, entry: Any, steps: int, steps_field: str) -> None:
    """Raise before any work on a config that cannot run (field, value and fix in the message)."""
    check_inputs(cfg, entry)
    if steps < 1:
        raise ValueError(f"{steps_field}={steps}: recipe {cfg.recipe!r} trains for {steps_field} optimizer "
                         f"steps; set {steps_field}=N with N >= 1")
    if cfg.trainer.backend != "local":
        raise ValueError(f"trainer.backend={cfg.trainer.backend!r}: SFT and preference recipes run in "
                         "process; set trainer.backend=local")


def _positions(cfg: CheckpointRun) -> int | None:
    """The checkpoint's positions, from its config.json (no weights load)."""
    return config_positions(read_config(cfg.checkpoint.checkpoint))


def _open(cfg: CheckpointRun, output_dir: Path) -> Any:
    """The run folder with its config.json; returns the W&B run (or None)."""
    set_num_threads(cfg)
    open_run_folder(cfg, output_dir)
    return open_wandb_run(cfg, output_dir)


def run_sft_recipe(cfg: SFTRecipeConfig, output_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) an SFT or LoRA-SFT recipe for `sft.steps` steps; returns its summary."""
    if cfg.algorithm_name not in SFT_ALGORITHMS:
        raise ValueError(f"algorithm {cfg.algorithm_name!r} is not an SFT algorithm ({sorted(SFT_ALGORITHMS)})")
    t0 = time.perf_counter()
    entry = cfg.algorithm  # the loss settings of `sft.*`, the adapters of `checkpoint.lora_*` (SFTRecipeConfig)
    sft, data, optim = cfg.sft, cfg.data, cfg.sft_optim
    _check(cfg, entry, sft.steps, "sft.steps")
    rows = read_sft_rows(data.train_files)
    tokenizer = load_tokenizer(cfg.checkpoint.checkpoint)
    examples = encode_sft(rows, tokenizer, max_prompt_length=data.max_prompt_length,
                          max_response_length=data.max_response_length, positions=_positions(cfg))
    wandb_run = _open(cfg, output_dir)  # after every data check: nothing is written before
    model = policy_with_adapters(cfg)  # (the SFT entry's `lora` is checkpoint.lora(): its worker adds none again)
    set_activation_checkpointing(model, cfg.trainer.activation_checkpointing,
                                 memory_gib=cfg.trainer.activation_memory_gib)
    device, pad, seed = next(model.parameters()).device, _pad_id(tokenizer), cfg.trainer.seed
    size = sft.batch_size

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pick = step_indices(len(examples), size, step, seed=seed, purpose="sft-data")
        ids, attn, response = sft_batch([examples[i] for i in pick], pad)
        return ids.to(device), attn.to(device), response.to(device)

    worker = entry.worker(model, batches, optim, steps=sft.steps, seed=seed,
                          attention=resolved_attention(cfg.trainer, model),
                          max_tokens_per_pass=cfg.trainer.max_tokens_per_pass)
    validate = validator(cfg, model, tokenizer)
    run = start_run(output_dir, model, cfg.trainer, tokenizer=tokenizer, progress=progress,
                           wandb_run=wandb_run)
    run.run_phase(PhaseSpec(
        order=0, name="sft", steps=sft.steps, step_fn=worker.step, owner=worker,
        eval_fn=validate, eval_every=cfg.trainer.eval_every, save_every=cfg.trainer.save_every,
        on_end=(lambda: {"final_eval": validate()}) if validate is not None else None,
        log_keys=("loss", "grad_norm"),
    ))
    return finish(cfg, output_dir, run, model, tokenizer, steps=sft.steps, curves=("loss", "grad_norm"), t0=t0)


def run_preference_recipe(cfg: PreferenceRecipeConfig, output_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a preference recipe (DPO-style on ELBOs) for `trainer.max_steps` steps.

    The reference is the initial policy, taken before `Run` loads a resume checkpoint (so a resumed run
    compares against the same reference as an uninterrupted one): under LoRA the policy's own frozen base
    weights, else a frozen copy (offloaded between passes with `trainer.reference_offload`).
    """
    if cfg.algorithm_name not in PREFERENCE_ALGORITHMS:
        raise ValueError(f"algorithm {cfg.algorithm_name!r} is not a preference algorithm "
                         f"({sorted(PREFERENCE_ALGORITHMS)})")
    t0 = time.perf_counter()
    entry = cfg.algorithm
    data, ckpt = cfg.data, cfg.checkpoint
    _check(cfg, entry, cfg.trainer.max_steps, "trainer.max_steps")
    rows = read_preference_rows(data.train_files)
    tokenizer = load_tokenizer(ckpt.checkpoint)
    examples = encode_preference(rows, tokenizer, max_prompt_length=data.max_prompt_length,
                                 max_response_length=data.max_response_length, positions=_positions(cfg))
    wandb_run = _open(cfg, output_dir)  # after every data check: nothing is written before
    model = policy_with_adapters(cfg)
    set_activation_checkpointing(model, cfg.trainer.activation_checkpointing,
                                 memory_gib=cfg.trainer.activation_memory_gib)
    # the reference by the RL assembly's rule: under LoRA the policy's own base weights (no copy), else a
    # frozen copy of the initial policy (on the CPU between its passes with trainer.reference_offload)
    reference = model if ckpt.lora_rank else copy.deepcopy(model)
    device, pad, seed = next(model.parameters()).device, _pad_id(tokenizer), cfg.trainer.seed
    size = cfg.preference.pairs_per_step

    def batches(step: int) -> PreferenceBatch:
        pick = step_indices(len(examples), size, step, seed=seed, purpose="preference-data")
        b = preference_batch([examples[i] for i in pick], pad)
        return PreferenceBatch(*(getattr(b, f.name).to(device) for f in dataclasses.fields(b)))

    optim = cfg.preference_optim
    worker = OfflineWorker(model, entry, batches, optim, seed=seed, steps=cfg.trainer.max_steps, ref_model=reference,
                           reference_offload=cfg.trainer.reference_offload,
                           attention=resolved_attention(cfg.trainer, model),
                           max_tokens_per_pass=cfg.trainer.max_tokens_per_pass)
    validate = validator(cfg, model, tokenizer)
    run = start_run(output_dir, model, cfg.trainer, tokenizer=tokenizer, progress=progress,
                           wandb_run=wandb_run)
    run.run_phase(PhaseSpec(
        order=0, name="preference", steps=cfg.trainer.max_steps, step_fn=worker.step, owner=worker,
        eval_fn=validate, eval_every=cfg.trainer.eval_every, save_every=cfg.trainer.save_every,
        on_end=(lambda: {"final_eval": validate()}) if validate is not None else None,
        log_keys=("loss", "reward_margin", "pair_accuracy"),
    ))
    return finish(cfg, output_dir, run, model, tokenizer, steps=cfg.trainer.max_steps,
                  curves=("loss", "reward_margin", "pair_accuracy"), t0=t0)
