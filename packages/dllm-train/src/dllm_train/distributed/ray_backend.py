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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, TypeVarTuple, Unpack

import torch

from dllm_train.algorithm import RLAlgorithm
from dllm_train.config import RLConfig, TrainerConfig
from dllm_train.distributed.parallel_dims import ParallelDims
from dllm_train.distributed.rank import RankSetup, RankWorker
from dllm_train.step import PromptSampler, RankRollout, RolloutArgs, rl_step, shard_rows

logger = logging.getLogger(__name__)

SetupFn = Callable[[], RankSetup]
"""Builds a rank's `RankSetup`; pickled to every actor, so it must be importable there."""

Args = TypeVarTuple("Args")
R = TypeVar("R")
RankMethod = Callable[[RankWorker, Unpack[Args]], R]
"""A `RankWorker` method named by reference (`RankWorker.update`): mypy checks its name, its
arguments and its result at the call site, so a renamed method is a type error on the driver."""


def method_name(method: Callable[..., Any]) -> str:
    """The name under which a rank runs `method`; raises `TypeError` unless it is a `RankWorker` method."""
    name = getattr(method, "__name__", "")
    if getattr(RankWorker, name, None) is not method:
        raise TypeError(f"{method!r} is not a method of RankWorker; pass one by reference, e.g. RankWorker.update")
    return name


@dataclass(frozen=True, kw_only=True)
class DistributedConfig:
    """How the trainer's ranks are placed on Ray.

    The rank grid itself is the trainer's (`TrainerConfig.num_workers`, `gpus_per_worker`,
    `sequence_parallel`): this holds only what Ray adds to it.

    Attributes:
        cpus_per_worker: CPUs reserved per rank.
        placement_strategy: Ray placement-group strategy: "PACK", "SPREAD", "STRICT_PACK",
            "STRICT_SPREAD" (multi-node: "SPREAD" or "PACK").
        bf16: compute in bfloat16 (FSDP2 MixedPrecisionPolicy; fp32 master weights and reduce).
    """

    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"
    bf16: bool = False

    def __post_init__(self) -> None:
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.placement_strategy not in strategies:
            raise ValueError(f"distributed.placement_strategy {self.placement_strategy!r} unknown; choose one of {strategies}")


def rank_dims(trainer: TrainerConfig) -> ParallelDims:
    """The rank grid of the trainer's Ray backend (`trainer.num_workers` x `trainer.sequence_parallel`)."""
    return ParallelDims(world_size=trainer.num_workers, sequence_parallel=trainer.sequence_parallel)


class RankActor:
    """The Ray actor body: a thin shell that builds one `RankWorker` and forwards calls to it."""

    def __init__(self) -> None:
        self.worker: RankWorker | None = None

    def address(self) -> tuple[str, int]:
        import ray

        from dllm_train.distributed.fsdp import free_port

        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return ip, free_port()

    def start(self, setup_fn: SetupFn, rank: int, addr: str, port: int, trainer: TrainerConfig,
              cfg: DistributedConfig) -> None:
        from dllm_train.distributed.fsdp import init_process_group

        gpu = trainer.gpus_per_worker > 0
        if not gpu:
            torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
        init_process_group(rank=rank, world_size=trainer.num_workers, master_addr=addr, master_port=port,
                           backend="nccl" if gpu else "gloo")
        self.worker = RankWorker(setup_fn(), device="cuda" if gpu else "cpu",
                                 param_dtype=torch.bfloat16 if cfg.bf16 else None,
                                 sequence_parallel=trainer.sequence_parallel)

    def call(self, name: str, *args: Any) -> Any:
        """Run `RankWorker.<name>` (a name `method_name` checked on the driver)."""
        assert self.worker is not None, "start() first"
        return getattr(self.worker, name)(*args)

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayActorGroup:
    """`trainer.num_workers` `RankActor`s in one placement group: the `dllm_train.step.Ranks` of a Ray run.

    `call(RankWorker.m, *args)` runs a rank method on every rank with the same arguments,
    `call_each(RankWorker.m, per_rank)` with rank r's `per_rank[r]`; both return the results by
    rank. Rank r's data-parallel group is r // `trainer.sequence_parallel`.

    Args:
        setup_fn: builds each rank's `RankSetup` (importable on the workers).
        trainer: the rank grid (`num_workers`, `gpus_per_worker`, `sequence_parallel`).
        cfg: the Ray placement.
    """

    def __init__(self, setup_fn: SetupFn, trainer: TrainerConfig, cfg: DistributedConfig = DistributedConfig()) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init()
        bundle: dict[str, float] = {"CPU": cfg.cpus_per_worker}
        if trainer.gpus_per_worker:
            bundle["GPU"] = float(trainer.gpus_per_worker)
        self.pg = placement_group([dict(bundle) for _ in range(trainer.num_workers)], strategy=cfg.placement_strategy)
        ray.get(self.pg.ready())
        self.dims = rank_dims(trainer)
        self.size = self.dims.world_size
        self.data_parallel = self.dims.data_parallel
        cls: Any = ray.remote(RankActor)
        self.actors: list[Any] = [
            cls.options(
                num_cpus=cfg.cpus_per_worker, num_gpus=trainer.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=i),
            ).remote()
            for i in range(trainer.num_workers)
        ]
        try:
            addr, port = ray.get(self.actors[0].address.remote())
            ray.get([a.start.remote(setup_fn, r, addr, port, trainer, cfg) for r, a in enumerate(self.actors)])
        except BaseException:  # a rank failed to start: free the group's resources, then report it
            self._release()
            raise

    def call(self, method: RankMethod[Unpack[Args], R], *args: Unpack[Args]) -> list[R]:
        """Run `method` (e.g. `RankWorker.full_weights`) with `args` on every rank; results by rank."""
        return self.call_each(method, [args] * len(self.actors))

    def call_each(self, method: RankMethod[Unpack[Args], R], per_rank: Sequence[tuple[Unpack[Args]]]) -> list[R]:
        """Run `method` on every rank, rank r with the arguments `per_rank[r]`; results by rank."""
        import ray

        if len(per_rank) != len(self.actors):
            raise ValueError(f"{len(per_rank)} argument tuples for {len(self.actors)} ranks")
        name = method_name(method)
        return list(ray.get([a.call.remote(name, *x) for a, x in zip(self.actors, per_rank)]))

    def group_of(self, rank: int) -> int:
        return self.dims.dp_rank(rank)

    def rollout(self, args: list[RolloutArgs]) -> list[RankRollout]:
        return self.call_each(RankWorker.rollout_step, args)

    def update(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
        return self.call_each(RankWorker.update, [(a,) for a in advantages])

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


class RayRLWorkflow:
    """The RL phase over a Ray actor group: the same `dllm_train.rl_step` as one process.

    Args:
        setup_fn: builds each rank's `RankSetup` (importable on the workers).
        prompts: step -> PromptBatch, evaluated on the driver.
        algorithm: the same algorithm the ranks build (the driver uses its advantage estimator).
        trainer, rl: trainer and batch-shape configs (the rank grid is the trainer's:
            `num_workers`, `gpus_per_worker`, `sequence_parallel`).
        dist: the Ray placement of the ranks.
        driver_model: if given, the driver's copy of the policy is refreshed with the trained
            weights at every eval/save step and at the end (so `Run` checkpoints and evaluation
            see them), and `load_state` hands its weights to the ranks (resume).
    """

    def __init__(self, *, setup_fn: SetupFn, prompts: PromptSampler, algorithm: RLAlgorithm[Any],
                 trainer: TrainerConfig, rl: RLConfig, dist: DistributedConfig = DistributedConfig(),
                 driver_model: Any = None) -> None:
        shard_rows(rl.prompts_per_step * rl.group_size, rank_dims(trainer).data_parallel, 0)  # validate the split
        self.prompts = prompts
        self.algorithm = algorithm
        self.trainer = trainer
        self.rl = rl
        self.dist = dist
        self.driver_model = driver_model
        self.group = RayActorGroup(setup_fn, trainer, dist)
        self.driver_stale = False  # the ranks trained since the driver's model last took their weights

    def step(self, step: int) -> dict[str, float]:
        metrics = rl_step(step, prompts=self.prompts, ranks=self.group, algorithm=self.algorithm,
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
        full = self.group.call(RankWorker.full_weights)[0]
        model.load_state_dict(full)

    def state(self) -> dict[str, Any]:
        """The ranks' update counters, for `Run` checkpoints; the parameters and optimizer state
        are written by the ranks themselves (`save_shards`)."""
        return self.group.call(RankWorker.state)[0]

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
        self.group.call(RankWorker.save_shards, str(folder))

    def load_shards(self, folder: Path) -> None:
        """Inverse of `save_shards`: the ranks' actors, optimizers and rollout replicas resume exactly
        (the references stay the initial policy)."""
        self.group.call(RankWorker.load_shards, str(folder))

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`; `Run` then calls `load_shards`. A state holding "optimizer" comes from a
        checkpoint without shards (written before them): with a driver model, the ranks' actors and
        rollout replicas first take its weights (a resuming `Run` has loaded the checkpoint's weights
        into it), then rank 0's full optimizer state is broadcast."""
        n = self.trainer.num_workers
        if "optimizer" in state and self.driver_model is not None:
            weights = {k: v.detach().cpu() for k, v in self.driver_model.state_dict().items()}
            self.group.call_each(RankWorker.load_weights, [(weights if r == 0 else {},) for r in range(n)])
        self.group.call(RankWorker.load_state, state)

    def shutdown(self) -> None:
        self.group.shutdown()


__all__ = ["DistributedConfig", "RankActor", "RankMethod", "RayActorGroup", "RayRLWorkflow", "SetupFn", "method_name",
           "rank_dims"]
