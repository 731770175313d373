"""`trainer.backend="ray"`: N `RankWorker`s as Ray actors forming one torch.distributed group.

The driver (`RayRLWorkflow`) owns the loop and the data split; actors own the models:

1. the driver expands the step's prompts and per-sample seeds, gives rank r rows
   [r B/N, (r+1) B/N), and each rank generates (unsharded replica), scores and prepares them
   (`PolicyRank.rollout_step`: the algorithm's per-batch data, drawn from the rank's own
   generator, then the old and reference values);
2. the driver gathers the scores, computes group-relative advantages on the full batch (groups
   may straddle ranks) and sends each rank its rows;
3. each rank runs `ActorWorker.update` on its FSDP2-sharded policy (gradients are averaged by the
   reduce-scatter) and refreshes its rollout replica with the gathered full weights (only the
   adapter weights when the model has LoRA adapters).

With `sequence_parallel` S > 1 the N ranks form N / S data-parallel groups of S consecutive ranks:
each group gets B S / N rows, and its ranks split every sequence of them (`ParallelDims`).

Placement: one bundle per rank ({"CPU": 1} or {"CPU": 1, "GPU": 1}) in a placement group, so the
same code spans nodes (strategy "SPREAD"/"PACK"); rank 0's node IP and a free port on it are the
rendezvous. Rollout is colocated with the actor on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dllm_train.algorithm import RLAlgorithm
from dllm_train.config import RLConfig, TrainerConfig
from dllm_train.distributed.parallel_dims import ParallelDims
from dllm_train.distributed.rank import RankSetup, RankWorker
from dllm_train.step import PromptSampler, RankRollout, rl_step, shard_rows

logger = logging.getLogger(__name__)

SetupFn = Callable[[], RankSetup]
"""Builds a rank's `RankSetup`; pickled to every actor, so it must be importable there."""


@dataclass(frozen=True, kw_only=True)
class DistributedConfig:
    """The actor group.

    Attributes:
        num_workers: ranks (each data-parallel group holds B / (num_workers / sequence_parallel)
            samples of a step).
        sequence_parallel: ranks that split every sequence of one data-parallel group (Ulysses;
            1: none). Must divide num_workers and the attention head count.
        gpus_per_worker: 0 (CPU, gloo) or 1 (one GPU per rank, nccl).
        cpus_per_worker: CPUs reserved per rank.
        placement_strategy: Ray placement-group strategy: "PACK", "SPREAD", "STRICT_PACK",
            "STRICT_SPREAD" (multi-node: "SPREAD" or "PACK").
        bf16: compute in bfloat16 (FSDP2 MixedPrecisionPolicy; fp32 master weights and reduce).
    """

    num_workers: int = 2
    sequence_parallel: int = 1
    gpus_per_worker: int = 0
    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"
    bf16: bool = False

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"distributed.num_workers must be >= 1, got {self.num_workers}")
        if self.sequence_parallel < 1 or self.num_workers % self.sequence_parallel:
            raise ValueError(
                f"distributed.sequence_parallel={self.sequence_parallel} must be >= 1 and divide "
                f"distributed.num_workers={self.num_workers}"
            )
        if self.gpus_per_worker not in (0, 1):
            raise ValueError(f"distributed.gpus_per_worker must be 0 or 1, got {self.gpus_per_worker}")
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.placement_strategy not in strategies:
            raise ValueError(f"distributed.placement_strategy {self.placement_strategy!r} unknown; choose one of {strategies}")

    @property
    def pg_backend(self) -> str:
        return "nccl" if self.gpus_per_worker else "gloo"

    @property
    def dims(self) -> ParallelDims:
        return ParallelDims(world_size=self.num_workers, sequence_parallel=self.sequence_parallel)


class RankActor:
    """The Ray actor body: a thin shell that builds one `RankWorker` and forwards calls to it."""

    def __init__(self) -> None:
        self.worker: RankWorker | None = None

    def address(self) -> tuple[str, int]:
        import ray

        from dllm_train.distributed.fsdp import free_port

        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return ip, free_port()

    def start(self, setup_fn: SetupFn, rank: int, world_size: int, addr: str, port: int,
              cfg: DistributedConfig) -> None:
        from dllm_train.distributed.fsdp import init_process_group

        if not cfg.gpus_per_worker:
            torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
        init_process_group(rank=rank, world_size=world_size, master_addr=addr, master_port=port,
                           backend=cfg.pg_backend)
        device = "cuda" if cfg.gpus_per_worker else "cpu"
        self.worker = RankWorker(setup_fn(), device=device, param_dtype=torch.bfloat16 if cfg.bf16 else None,
                                 sequence_parallel=cfg.sequence_parallel)

    def call(self, method: str, *args: Any) -> Any:
        assert self.worker is not None, "start() first"
        return getattr(self.worker, method)(*args)

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayActorGroup:
    """N `RankActor`s in one placement group; `call` runs a method on every rank and gathers."""

    def __init__(self, setup_fn: SetupFn, cfg: DistributedConfig) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init()
        bundle: dict[str, float] = {"CPU": cfg.cpus_per_worker}
        if cfg.gpus_per_worker:
            bundle["GPU"] = float(cfg.gpus_per_worker)
        self.pg = placement_group([dict(bundle) for _ in range(cfg.num_workers)], strategy=cfg.placement_strategy)
        ray.get(self.pg.ready())
        cls: Any = ray.remote(RankActor)
        self.actors: list[Any] = [
            cls.options(
                num_cpus=cfg.cpus_per_worker, num_gpus=cfg.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=i),
            ).remote()
            for i in range(cfg.num_workers)
        ]
        try:
            addr, port = ray.get(self.actors[0].address.remote())
            ray.get([a.start.remote(setup_fn, r, cfg.num_workers, addr, port, cfg) for r, a in enumerate(self.actors)])
        except BaseException:  # a rank failed to start: free the group's resources, then report it
            self._release()
            raise

    def call(self, method: str, per_rank_args: list[tuple[Any, ...]] | None = None) -> list[Any]:
        """Run `RankWorker.<method>` on every rank (rank r gets per_rank_args[r]); results by rank."""
        import ray

        args = per_rank_args or [() for _ in self.actors]
        return list(ray.get([a.call.remote(method, *x) for a, x in zip(self.actors, args)]))

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Leave the process group on every rank, then end the actors and free their placement.

        A rank that died, or that still waits in a collective after another rank raised, does not
        answer: after `timeout_s` it is killed without leaving the group.
        """
        import ray
        from ray.exceptions import RayError

        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=timeout_s)
        except RayError as err:
            logger.warning("a rank did not leave the process group (%s); killing the actors", type(err).__name__)
        self._release()

    def _release(self) -> None:
        """End every actor and free the placement group (no collective: ranks may be gone)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.actors:
            ray.kill(a)
        remove_placement_group(self.pg)


class RayRanks:
    """The `dllm_train.step.Ranks` of a Ray actor group (rank r's data-parallel group: r // sp)."""

    def __init__(self, group: RayActorGroup, cfg: DistributedConfig) -> None:
        self.group = group
        self.cfg = cfg
        self.size = cfg.num_workers
        self.data_parallel = cfg.dims.data_parallel

    def group_of(self, rank: int) -> int:
        return self.cfg.dims.dp_rank(rank)

    def rollout(self, args: list[tuple[Any, ...]]) -> list[RankRollout]:
        return self.group.call("rollout_step", args)

    def update(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
        return self.group.call("update", [(a,) for a in advantages])


class RayRLWorkflow:
    """The RL phase over a Ray actor group: the same `dllm_train.rl_step` as one process.

    Args:
        setup_fn: builds each rank's `RankSetup` (importable on the workers).
        prompts: step -> PromptBatch, evaluated on the driver.
        algorithm: the same algorithm the ranks build (the driver uses its advantage estimator).
        trainer, rl: trainer and batch-shape configs.
        dist: the actor group.
        driver_model: if given, the driver's copy of the policy is refreshed with the trained
            weights at every eval/save step and at the end (so `Run` checkpoints and evaluation
            see them), and `load_state` hands its weights to the ranks (resume).
    """

    def __init__(self, *, setup_fn: SetupFn, prompts: PromptSampler, algorithm: RLAlgorithm[Any],
                 trainer: TrainerConfig, rl: RLConfig, dist: DistributedConfig,
                 driver_model: Any = None) -> None:
        if trainer.sequence_parallel != dist.sequence_parallel:
            raise ValueError(f"trainer.sequence_parallel={trainer.sequence_parallel} but distributed.sequence_parallel="
                             f"{dist.sequence_parallel}; build DistributedConfig(sequence_parallel="
                             "trainer.sequence_parallel)")
        shard_rows(rl.prompts_per_step * rl.group_size, dist.dims.data_parallel, 0)  # validate the split
        self.prompts = prompts
        self.algorithm = algorithm
        self.trainer = trainer
        self.rl = rl
        self.dist = dist
        self.driver_model = driver_model
        self.group = RayActorGroup(setup_fn, dist)
        self.ranks = RayRanks(self.group, dist)
        self.driver_stale = False  # the ranks trained since the driver's model last took their weights

    def step(self, step: int) -> dict[str, float]:
        metrics = rl_step(step, prompts=self.prompts, ranks=self.ranks, algorithm=self.algorithm,
                          seed=self.trainer.seed)
        self.driver_stale = self.driver_model is not None
        if self.driver_model is not None and self._sync_due(step + 1):
            self.pull_weights(self.driver_model)
            self.driver_stale = False
        return metrics

    def _sync_due(self, done: int) -> bool:
        t = self.trainer
        return done == t.max_steps or any(every and done % every == 0 for every in (t.eval_every, t.save_every))

    def pull_weights(self, model: Any) -> None:
        """Load the trained full weights (gathered on rank 0) into a driver-side model."""
        full = self.group.call("full_weights")[0]
        model.load_state_dict(full)

    def state(self) -> dict[str, Any]:
        """The ranks' update counters, for `Run` checkpoints; the parameters and optimizer state
        are written by the ranks themselves (`save_shards`)."""
        out: dict[str, Any] = self.group.call("state")[0]
        return out

    def save_shards(self, folder: Path) -> None:
        """Every rank writes its shards of the actor's parameters (FSDP2's float32 masters under
        mixed precision) and optimizer state into `folder` (a checkpoint's `shards/`, on a path
        every rank reaches). Nothing travels through the driver: gathering the full AdamW state on
        rank 0 and shipping it through Ray would hold up to three copies of it in host memory
        (docs/benchmarks.md). A checkpoint off the sync period
        (a preemption's) first refreshes the driver's model, which `Run` writes beside the shards."""
        if self.driver_stale and self.driver_model is not None:
            self.pull_weights(self.driver_model)
            self.driver_stale = False
        self.group.call("save_shards", [(str(folder),) for _ in range(self.dist.num_workers)])

    def load_shards(self, folder: Path) -> None:
        """Inverse of `save_shards`: the ranks' actors, optimizers and rollout replicas resume exactly
        (the references stay the initial policy)."""
        self.group.call("load_shards", [(str(folder),) for _ in range(self.dist.num_workers)])

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`; `Run` then calls `load_shards`. A state holding "optimizer" comes from a
        checkpoint without shards (written before them): with a driver model, the ranks' actors and
        rollout replicas first take its weights (a resuming `Run` has loaded the checkpoint's weights
        into it), then rank 0's full optimizer state is broadcast."""
        n = self.dist.num_workers
        if "optimizer" in state and self.driver_model is not None:
            weights = {k: v.detach().cpu() for k, v in self.driver_model.state_dict().items()}
            self.group.call("load_weights", [(weights if r == 0 else {},) for r in range(n)])
        self.group.call("load_state", [(state,) for _ in range(n)])

    def shutdown(self) -> None:
        self.group.shutdown()


__all__ = ["DistributedConfig", "RankActor", "RayActorGroup", "RayRLWorkflow", "RayRanks", "SetupFn"]
