"""Spawning a 2-process gloo group on CPU and collecting each rank's results."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable[[int], Any], world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(fn(rank), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[[int], Any], world: int = 2) -> list[Any]:
    """Run module-level `fn(rank)` on `world` spawned gloo ranks; returns each rank's result."""
    from dllm_train.distributed.fsdp import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_entry, args=(fn, world, free_port(), out), nprocs=world, join=True,
                           start_method="spawn")
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def partial_credit(text: str, answer: str) -> float:
    """Matching characters / answer length (an untrained model's group rewards then differ)."""
    return sum(a == b for a, b in zip(text, answer)) / len(answer)


def tiny_rank_setup() -> Any:
    """`RankSetup` of the tiny addition RL setup (runs inside each Ray actor)."""
    from dare.algorithms import build_objective
    from dare.quickstart import build_tiny_model
    from dare.tasks.addition import build_tokenizer
    from dllm_train.distributed import RankSetup
    from tests.dllm_train.helpers import tiny_config

    cfg = tiny_config()
    tok = build_tokenizer()
    return RankSetup(model=build_tiny_model(cfg, tok), sampling=cfg.rollout, reward_fn=partial_credit,
                     detokenize=tok.decode, objective=build_objective(cfg.algorithm, cfg.rl),
                     optim=cfg.rl_optim, seed=cfg.trainer.seed)


def algorithm_rank_setup(family: str, name: str, fields: dict[str, Any], lora_rank: int = 0) -> Any:
    """`RankSetup` of algorithm `name` (registry entry with `fields` replaced) on a tiny `family`
    model, optionally with LoRA adapters (runs inside each Ray actor)."""
    from dllm_train import OptimConfig
    from dllm_train.distributed import RankSetup
    from tests.dllm_train.algo_helpers import TOK, partial_reward, tiny_model

    model = tiny_model(family)
    if lora_rank:
        from dllm_models import apply_lora

        apply_lora(model, rank=lora_rank, alpha=2.0 * lora_rank)
        # peft starts from B = 0 (then only B moves at first): a non-zero start moves A and B
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return RankSetup(model=model, sampling=TINY_SAMPLING, reward_fn=partial_reward, detokenize=TOK.decode,
                     objective=algorithm_objective(name, fields), optim=OptimConfig(lr=1e-3), seed=0)


def algorithm_objective(name: str, fields: dict[str, Any]) -> Any:
    """The PolicyObjective of registry entry `name` with `fields` replaced, for the tiny RL batch."""
    import dataclasses

    from dare.algorithms import build_objective, get_algorithm

    return build_objective(name, TINY_RL, dataclasses.replace(get_algorithm(name), **fields))  # type: ignore[type-var]


def _tiny_constants() -> tuple[Any, Any]:
    from dllm_rollout import SamplingConfig
    from dllm_train import RLConfig

    return (SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0),
            RLConfig(prompts_per_step=2, group_size=4))


TINY_SAMPLING, TINY_RL = _tiny_constants()
