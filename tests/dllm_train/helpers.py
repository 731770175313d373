"""A tiny RL setup on the addition task for trainer tests."""

from __future__ import annotations

from typing import Any

from dare.algorithms import build_objective
from dare.config import RunConfig, TinyModelConfig, apply_overrides
from dare.quickstart import build_tiny_model
from dare.recipes import quickstart
from dare.tasks.addition import AdditionConfig, AdditionTask, build_tokenizer, exact_match_reward
from dllm_train import ActorWorker, PromptBatch, RewardWorker, RLWorkflow, RolloutWorker, derive_seed

TINY = [
    "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.mlp_hidden_size=64",
    "task.num_eval=20", "sft.steps=3", "sft.batch_size=8", "rl.prompts_per_step=2",
    "rl.group_size=4", "trainer.max_steps=4", "trainer.eval_every=0", "trainer.save_every=0",
    "rl_optim.lr=1e-3",
]


def tiny_config(*extra: str) -> RunConfig:
    cfg: RunConfig = apply_overrides(quickstart(), [*TINY, *extra])
    return cfg


def tiny_workflow(cfg: RunConfig) -> tuple[RLWorkflow, Any]:
    tok = build_tokenizer()
    task = AdditionTask(cfg.task, tok)
    model = build_tiny_model(cfg, tok)

    def prompts(step: int) -> PromptBatch:
        pairs = task.train_pairs(cfg.rl.prompts_per_step, derive_seed(cfg.trainer.seed, "rl-data", step))
        return PromptBatch([task.encode(task.prompt(a, b)) for a, b in pairs],
                           [task.answer(a, b) for a, b in pairs], cfg.rl.group_size)

    objective = build_objective(cfg.algorithm, cfg.rl)
    wf = RLWorkflow(prompts=prompts, rollout=RolloutWorker(model, cfg.rollout, objective=objective),
                    reward=RewardWorker(exact_match_reward, tok.decode),
                    actor=ActorWorker(model, objective, cfg.rl_optim), objective=objective,
                    trainer=cfg.trainer, rl=cfg.rl)
    return wf, model


__all__ = ["AdditionConfig", "TinyModelConfig", "tiny_config", "tiny_workflow"]
