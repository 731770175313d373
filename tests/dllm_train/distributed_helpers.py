"""Spawning a 2-process gloo group on CPU, and the `RankSetup` of the tiny RL runs on Ray."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dllm_train import OptimConfig, RLAlgorithm, RLConfig, TrainerConfig
from tests.tiny_rl import SAMPLING, TOK, partial_reward, tiny_model

TINY_SAMPLING = SAMPLING
TINY_RL = RLConfig(prompts_per_step=2, group_size=4)
"""The batch shape of `tests.tiny_rl.local_rl`'s defaults: 2 prompts x 4 samples."""


def _entry(rank: int, fn: Callable[[int], Any], world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(fn(rank), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[[int], Any], world: int = 2, attempts: int = 3) -> list[Any]:
    """Run module-level `fn(rank)` on `world` spawned gloo ranks; returns each rank's result.

    A rank killed by a signal before it reports (gloo aborts when the rendezvous port, free when
    drawn, was taken meanwhile: the session's Ray cluster opens ports all the time) is retried on a
    new port, up to `attempts` times; an exception raised by `fn` fails at once.
    """
    from dllm_train.distributed.fsdp import free_port

    for attempt in range(attempts):
        with tempfile.TemporaryDirectory() as out:
            try:
                mp.start_processes(_entry, args=(fn, world, free_port(), out), nprocs=world, join=True,
                                   start_method="spawn")
            except mp.ProcessExitedException:
                if attempt + 1 == attempts:
                    raise
                continue
            return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    raise AssertionError("unreachable")


def algorithm_rank_setup(family: str, algorithm: RLAlgorithm[Any], lora_rank: int = 0, **trainer: Any) -> Any:
    """`RankSetup` of `algorithm` on a tiny `family` model (`tests.tiny_rl`), optionally with LoRA
    adapters, trainer fields as keywords (runs inside each Ray actor)."""
    from dllm_train.distributed import RankSetup

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
                     algorithm=algorithm, optim=OptimConfig(lr=1e-3, grad_clip=1.0),
                     trainer=TrainerConfig(max_steps=2, seed=0, backend="ray", num_workers=2, **trainer))


def tiny_rank_setup() -> Any:
    """`RankSetup` of d1 on the tiny LLaDA model: `tests.tiny_rl.local_rl(tiny_model("llada"), D1())`'s."""
    from dllm_algorithms import D1

    return algorithm_rank_setup("llada", D1())


__all__ = ["TINY_RL", "TINY_SAMPLING", "algorithm_rank_setup", "run_ranks", "tiny_rank_setup"]
