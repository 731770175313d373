"""Tiny models of every family on the addition task, and an RL workflow for any algorithm."""

from __future__ import annotations

import copy
from typing import Any

import torch

from dare.algorithms import build_objective, get_algorithm
from dare.config import TinyModelConfig
from dare.quickstart import build_tiny_model
from dare.recipes import quickstart
from dare.tasks.addition import AdditionConfig, AdditionTask, build_tokenizer
from dllm_models import build_model
from dllm_rollout import SamplingConfig
from dllm_train import (
    ActorWorker,
    OptimConfig,
    PromptBatch,
    ReferenceWorker,
    RewardWorker,
    RLConfig,
    RLWorkflow,
    RolloutWorker,
    TrainerConfig,
    derive_seed,
)
from tests.dllm_models.tiny_configs import TINY_CONFIGS

FAMILIES = {"llada": None, "dream": "Dream", "sdar": "sdar", "llada2": "llada2_moe"}
TOK = build_tokenizer()
TASK = AdditionTask(AdditionConfig(digits=3, num_eval=20, seed=1234), TOK)


def tiny_model(family: str, seed: int = 0) -> Any:
    ids = {"vocab_size": len(TOK), "mask_token_id": TOK.mask_token_id, "eos_token_id": TOK.eos_token_id,
           "pad_token_id": TOK.pad_token_id}
    if family == "llada":
        import dataclasses

        cfg = dataclasses.replace(quickstart(), model=TinyModelConfig(d_model=32, n_layers=1, n_heads=2,
                                                                      mlp_hidden_size=64))
        return build_tiny_model(cfg, TOK)
    raw = TINY_CONFIGS[FAMILIES[family]](**ids)
    if family == "dream":
        raw["max_position_embeddings"] = 64
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(seed), std=0.05)  # type: ignore[operator]
    return model


def partial_reward(text: str, answer: str) -> float:
    return sum(a == b for a, b in zip(text, answer)) / len(answer)


def workflow(model: Any, name: str, *, algorithm: Any = None, group_size: int = 4, prompts_per_step: int = 2,
             lr: float = 1e-3, sampling: SamplingConfig | None = None, reward: Any = partial_reward,
             seed: int = 0) -> RLWorkflow:
    rl = RLConfig(prompts_per_step=prompts_per_step, group_size=group_size)
    entry = algorithm or get_algorithm(name)
    objective = build_objective(name, rl, entry)
    sampling = sampling or SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0)
    frozen = copy.deepcopy(model)
    reference = ReferenceWorker(frozen) if objective.needs_reference else None
    ref_model = frozen if objective.needs_rollout_reference else None

    def prompts(step: int) -> PromptBatch:
        pairs = TASK.train_pairs(prompts_per_step, derive_seed(seed, "rl-data", step))
        return PromptBatch([TASK.encode(TASK.prompt(a, b)) for a, b in pairs],
                           [TASK.answer(a, b) for a, b in pairs], group_size)

    return RLWorkflow(prompts=prompts, rollout=RolloutWorker(model, sampling, objective=objective, ref_model=ref_model),
                      reward=RewardWorker(reward, TOK.decode),
                      actor=ActorWorker(model, objective, OptimConfig(lr=lr, grad_clip=1.0)), objective=objective,
                      trainer=TrainerConfig(max_steps=1, seed=seed), rl=rl, reference=reference)
