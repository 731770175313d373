"""Recipes: plain functions returning a RunConfig, listed in one dict."""

from __future__ import annotations

from collections.abc import Callable

from dare.config import EvalConfig, RunConfig, TinyModelConfig
from dare.tasks.addition import AdditionConfig
from dllm_rollout import SamplingConfig
from dllm_train import OptimConfig, RLConfig, SFTConfig, TrainerConfig


def quickstart() -> RunConfig:
    """Tiny LLaDA-architecture model on 3-digit addition: SFT warm start, then d1 RL (CPU, minutes)."""
    return RunConfig(
        recipe="quickstart",
        algorithm="d1",
        task=AdditionConfig(digits=3, num_eval=500, seed=1234),
        model=TinyModelConfig(d_model=128, n_layers=4, n_heads=4, mlp_hidden_size=384),
        sft=SFTConfig(steps=450, batch_size=128, eps=1e-3, normalizer="masked", weight_by_t=False),
        sft_optim=OptimConfig(lr=1e-3, warmup_steps=50, grad_clip=1.0),
        rl=RLConfig(prompts_per_step=16, group_size=8),
        rl_optim=OptimConfig(lr=3e-5, grad_clip=1.0),
        rollout=SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0),
        eval=EvalConfig(batch_size=250),
        trainer=TrainerConfig(max_steps=1200, seed=0, eval_every=200, save_every=200, log_every=1),
    )


RECIPES: dict[str, Callable[[], RunConfig]] = {
    "quickstart": quickstart,
}


def get_recipe(name: str) -> RunConfig:
    if name not in RECIPES:
        raise ValueError(f"recipe {name!r} is unknown; choose one of {sorted(RECIPES)} (see `dare recipes`)")
    return RECIPES[name]()
