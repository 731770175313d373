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
