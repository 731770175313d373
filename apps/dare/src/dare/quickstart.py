"""The quick start pipeline: build a tiny model, SFT warm start, evaluate, d1 RL, evaluate."""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from dare.config import QuickstartConfig
from dare.rl_backend import rl_backend
from dare.run_folder import start_run, writing_run_folder
from dare.sinks import curves_title, drop_zero_panels, open_wandb_run
from dare.tasks.addition import AdditionTask, build_tokenizer, exact_match_reward
from dllm_algorithms import SFT
from dllm_models import build_model, save_model, set_kernels
from dllm_rollout import SamplingConfig, decode, left_pad
from dllm_train import (
    PhaseSpec,
    PromptBatch,
    derive_seed,
    generator,
    plot_curves,
    read_metrics,
    replace_text,
)

logger = logging.getLogger(__name__)


def rank_setup(cfg: QuickstartConfig, weights: dict[str, torch.Tensor], run_dir: str | None = None) -> Any:
    """One Ray rank's workers (module-level, so Ray pickles it by reference)."""
    from dllm_train.distributed import RankSetup

    tok = build_tokenizer()
    model = build_tiny_model(cfg, tok)
    model.load_state_dict(weights)
    return RankSetup(model=model, sampling=cfg.rollout, reward_fn=exact_match_reward, detokenize=tok.decode,
                     algorithm=cfg.algorithm, optim=cfg.rl_optim, trainer=cfg.trainer, run_dir=run_dir)


def build_tiny_model(cfg: QuickstartConfig, tokenizer: Any) -> Any:
    """A LLaDA-architecture model sized by `cfg.model`, with the tokenizer's special ids and the run's `kernels`."""
    m = cfg.model
    raw = {
        "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": m.d_model,
        "n_layers": m.n_layers, "n_heads": m.n_heads, "n_kv_heads": m.n_heads,
        "mlp_hidden_size": m.mlp_hidden_size, "vocab_size": len(tokenizer),
        "embedding_size": len(tokenizer), "rope_theta": m.rope_theta, "rms_norm_eps": 1e-5,
        "max_sequence_length": 64, "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
        "torch_dtype": "float32",
    }
    model = build_model(raw)
    model.reset_parameters(generator=generator(cfg.trainer.seed, "init"), std=m.init_std)  # type: ignore[operator]
    return set_kernels(model, cfg.kernels)  # on the driver and on every rank (both build it here)


def evaluate_accuracy(model: Any, task: AdditionTask, cfg: QuickstartConfig) -> float:
    """Greedy-decoding exact-match accuracy on the held-out pairs."""
    # a block-diffusion model is decoded block by block (its own block size), whatever the rollout says
    block = model.traits.block_length
    greedy = SamplingConfig(max_new_tokens=cfg.rollout.max_new_tokens, steps=cfg.rollout.steps,
                            block_length=block or cfg.rollout.block_length, temperature=0.0,
                            block_diffusion=block is not None)
    was_training = model.training
    model.eval()
    correct = 0
    pairs = task.eval_pairs
    size = cfg.eval.batch_size
    for i in range(0, len(pairs), size):
        chunk = pairs[i: i + size]
        ids, mask = left_pad([task.encode(task.prompt(a, b)) for a, b in chunk], model.traits.pad_token_id)
        out = decode(model, ids, mask, torch.zeros(len(chunk), dtype=torch.long), greedy)
        for (a, b), row in zip(chunk, out.response_ids.tolist()):
            correct += int(exact_match_reward(task.tokenizer.decode(row), task.answer(a, b)) == 1.0)
    model.train(was_training)
    return correct / len(pairs)


def run_quickstart(cfg: QuickstartConfig, output_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) the quick start in `output_dir`; returns the summary it writes."""
    t0 = time.perf_counter()
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    with writing_run_folder(cfg, output_dir):
        return _train(cfg, output_dir, t0=t0, progress=progress)


def _train(cfg: QuickstartConfig, output_dir: Path, *, t0: float, progress: bool) -> dict[str, Any]:
    algorithm = cfg.algorithm
    sft_cfg, rl = cfg.sft, cfg.rl
    wandb_run = open_wandb_run(cfg, output_dir)
    tokenizer = build_tokenizer()
    task = AdditionTask(cfg.task, tokenizer)
    model = build_tiny_model(cfg, tokenizer)
    seed = cfg.trainer.seed
    run = start_run(output_dir, model, cfg.trainer, tokenizer=tokenizer, progress=progress,
                           wandb_run=wandb_run)

    def evaluate() -> dict[str, float]:
        return {"eval_accuracy": evaluate_accuracy(model, task, cfg)}

    sft = SFT(sft=sft_cfg).worker(
        model, lambda step: task.sft_batch(sft_cfg.batch_size, derive_seed(seed, "sft-data", step)), cfg.sft_optim,
        steps=sft_cfg.steps, seed=seed)
    run.run_phase(PhaseSpec(
        order=0, name="sft", steps=sft_cfg.steps, step_fn=sft.step, owner=sft,
        on_end=lambda: {"eval_accuracy_before_rl": evaluate()["eval_accuracy"]},
        metrics_file="sft_metrics.jsonl", log_keys=("loss",), save_every=cfg.trainer.save_every,
    ))
    logger.info("held-out accuracy after SFT: %.3f", run.results["eval_accuracy_before_rl"])

    def prompts(step: int) -> PromptBatch:
        pairs = task.train_pairs(rl.prompts_per_step, derive_seed(seed, "rl-data", step))
        return PromptBatch([task.encode(task.prompt(a, b)) for a, b in pairs],
                           [task.answer(a, b) for a, b in pairs], rl.group_size)

    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # the RL phase's initial policy
    step_fn, owner, shutdown = rl_backend(cfg, model, prompts=prompts, algorithm=algorithm,
                                          reward_fn=exact_match_reward, detokenize=tokenizer.decode,
                                          rank_setup=functools.partial(rank_setup, cfg, weights, str(output_dir)),
                                          output_dir=output_dir)
    try:
        run.run_phase(PhaseSpec(
            order=1, name="rl", steps=cfg.trainer.max_steps, step_fn=step_fn, owner=owner,
            eval_fn=evaluate, eval_every=cfg.trainer.eval_every, save_every=cfg.trainer.save_every,
            on_end=lambda: {"eval_accuracy_after_rl": evaluate()["eval_accuracy"]},
            log_keys=("reward_mean", "loss", "clip_frac", "eval_accuracy"),
        ))
    finally:
        shutdown()
    run.close()
    save_model(model, output_dir / "model", tokenizer=tokenizer)
    records = read_metrics(output_dir / "metrics.jsonl")
    before, after = run.results["eval_accuracy_before_rl"], run.results["eval_accuracy_after_rl"]
    keys, zero = drop_zero_panels(records, ["reward_mean", "eval_accuracy", "loss", "clip_frac", "ppo_kl",
                                            "consistency_max_abs_gap"],
                                  tolerance={"consistency_max_abs_gap": 1e-4})  # float32 rounding: ~1e-7
    detail = (f"{cfg.algorithm_name} RL on {task.cfg.digits}-digit addition: held-out accuracy {before:.1%} after "
              f"SFT -> {after:.1%} after RL" + (f"\n0 at every step (within float32 rounding), not drawn: "
                                               f"{', '.join(zero)}" if zero else ""))
    plot_curves(records, keys, output_dir / "reward.png", title=curves_title(cfg, output_dir, records, detail),
                points={"eval_accuracy": [(0, before, "after SFT (RL step 0)"),
                                          (cfg.trainer.max_steps, after, "after RL")]})
    summary = {
        "eval_accuracy_before_rl": run.results["eval_accuracy_before_rl"],
        "eval_accuracy_after_rl": run.results["eval_accuracy_after_rl"],
        "num_eval_prompts": len(task.eval_pairs),
        "sft_steps": sft_cfg.steps,
        "rl_steps": cfg.trainer.max_steps,
        "wall_time_s_this_invocation": round(time.perf_counter() - t0, 1),
        "model_dir": str((output_dir / "model").resolve()),
    }
    replace_text(output_dir / "summary.json", json.dumps(summary, indent=2))  # never through a link
    return summary
