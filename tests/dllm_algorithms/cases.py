"""Every RL algorithm of dllm_algorithms with small budgets, and the families the tests run it on."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import dllm_algorithms as da
from dllm_rollout import SamplingConfig
from dllm_train import RLAlgorithm, sample_seeds
from tests.tiny_rl import SAMPLING, addition_prompts, local_rl, text_reward

ALGORITHMS: dict[str, RLAlgorithm[Any]] = {
    "D1": da.D1(), "CoupledGRPO": da.CoupledGRPO(), "JustGRPO": da.JustGRPO(), "BGPO": da.BGPO(mc_num=2),
    "ESPO": da.ESPO(mc_num=2, num_iterations=2), "EBPO": da.EBPO(mc_num=2), "SPG": da.SPG(mc_num=2),
    "CJGRPO": da.CJGRPO(), "MDPO": da.MDPO(top_k_steps=2), "DTreeRPO": da.DTreeRPO(trees=2, branching=2, depth=2, num_iterations=2, row_shards=2),
    "DMPO": da.DMPO(num_iterations=2), "BridgeRatioGRPO": da.BridgeRatioGRPO(), "GDPO": da.GDPO(num_iterations=2),
    "TraceRL": da.TraceRL(shrink=2, min_group_accuracy=0.0, max_group_accuracy=1.0),
}
TEST_FAMILIES = ("llada", "sdar")
PAIRS = [(name, fam) for name, alg in ALGORITHMS.items() for fam in TEST_FAMILIES if fam in alg.families]
IDS = [f"{n}-{f}" for n, f in PAIRS]


def sampling_for(name: str) -> SamplingConfig:
    # JustGRPO replays left to right: decode one token per step
    return dataclasses.replace(SAMPLING, block_length=1) if name == "JustGRPO" else SAMPLING


def prepared_batch(name: str, family: str, model: Any, *, seed: int = 0, reuse: bool = True,
                   **trainer: Any) -> tuple[Any, Any, torch.Tensor]:
    """(LocalRL, Prepared, random advantages) of one rollout of algorithm `name` on `model`.

    `reuse=False` makes the actor run its separate old pass even where the training pass gives it.
    """
    alg = ALGORITHMS[name]
    trainer.setdefault("reward", text_reward)  # every group and tree node with distinct samples has a signal
    rl = local_rl(model, alg, sampling=sampling_for(name), seed=seed, grad_clip=0.0, **trainer)
    rl.actor.reuse_old = reuse
    prompts, answers, groups = addition_prompts(2, 4, seed)(0).expanded()
    rl.rank.rollout_step(0, prompts, answers, sample_seeds(seed, len(prompts), "rollout", 0), groups)
    prepared = rl.rank.prepared
    assert prepared is not None
    g = torch.Generator().manual_seed(seed + 11)
    advantages = torch.randn(len(prompts), generator=g, dtype=torch.float64).float()
    return rl, prepared, advantages
