"""The RL phase's backend, local or Ray, shared by the quick start and the checkpoint recipes.

Both run the same `dllm_train.rl_step`: `trainer.backend=local` over one in-process rank
(`dllm_train.LocalRL`) on the driver's model, `trainer.backend=ray` over `trainer.num_workers`
FSDP2 ranks (`dllm_train.distributed.RayRLWorkflow`, split into `trainer.num_workers /
trainer.sequence_parallel` data-parallel groups), each built by the recipe's picklable
`rank_setup()`. Resume works the same on both: `Run` loads the checkpoint's weights into the
driver's model and hands the returned owner its optimizer state; the local actor trains that model
itself, the Ray workflow passes its weights to the ranks first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dare.config import RLRecipeConfig, RLRun
from dllm_train import LocalRL, RLAlgorithm

StepFn = Callable[[int], dict[str, float]]


def rl_backend(cfg: RLRun, model: Any, *, prompts: Any, algorithm: RLAlgorithm[Any],
               reward_fn: Callable[[str, str], float], detokenize: Callable[[list[int]], str],
               rank_setup: Callable[[], Any], output_dir: Path | None = None) -> tuple[StepFn, Any, Callable[[], None]]:
    """(step_fn, checkpointed owner, shutdown) of the RL phase on `cfg.trainer.backend`.

    Build it while `model` still holds the initial policy (before `Run` loads a resumed
    checkpoint into it): the reference of algorithms that need one is a frozen copy of the
    initial policy, made here (local) or on the ranks from `rank_setup` (Ray).

    Args:
        cfg: the quick start or an RL recipe (trainer, rl, rollout and rl_optim are read; an RL
            recipe's checkpoint folder is the engine's).
        model: the driver's policy; local: trained in place; Ray: refreshed with the ranks'
            weights at every eval and save step and at the end (`RayRLWorkflow.driver_model`).
        prompts: step -> PromptBatch.
        algorithm: the RL algorithm.
        reward_fn, detokenize: the local workflow's verifier and decoder (Ray ranks build
            their own in `rank_setup`).
        rank_setup: picklable `() -> dllm_train.distributed.RankSetup` with the initial policy,
            run on every rank.
        output_dir: the run folder, where `trainer.save_rollouts_every` stores rollout records.
    """
    t, rl, optim = cfg.trainer, cfg.rl, cfg.rl_optim
    if t.backend == "ray":
        from dllm_train.distributed import DistributedConfig, RayRLWorkflow

        ray_wf = RayRLWorkflow(
            setup_fn=rank_setup, prompts=prompts, algorithm=algorithm, trainer=t, rl=rl, driver_model=model,
            dist=DistributedConfig(bf16=t.gpus_per_worker > 0 and _is_bf16(model)),
        )
        return ray_wf.step, ray_wf, ray_wf.shutdown
    local = LocalRL(model, prompts=prompts, sampling=cfg.rollout, reward_fn=reward_fn, detokenize=detokenize,
                    algorithm=algorithm, optim=optim, trainer=t,
                    engine_folder=cfg.checkpoint.checkpoint if isinstance(cfg, RLRecipeConfig) else None,
                    output_dir=output_dir)
    return local.step, local, lambda: None


def _is_bf16(model: Any) -> bool:
    import torch

    return bool(next(model.parameters()).dtype == torch.bfloat16)


__all__ = ["rl_backend"]
