"""One rank: the plain workers of `dllm_train.workers` around an FSDP2 policy.

A rank holds three views of the policy: the FSDP2-sharded actor (trained), an unsharded rollout
replica on the same device (generation; refreshed after every update with the gathered weights,
only the adapters when the model has LoRA adapters) and, if the algorithm needs one, an
FSDP2-sharded frozen reference (plus an unsharded frozen copy when the rollout itself scores with
the reference). Generating from the unsharded replica keeps decoding free of collectives, so ranks
may run different numbers of denoising steps without deadlocking; its cost is one extra copy of
the weights per device.

With sequence parallelism (`ParallelDims`), the ranks of one sequence-parallel group share their
rows: the group's leader generates and scores them and broadcasts the rollout, and every old,
reference and training pass runs through a `SequenceParallelScorer` (each rank computes its
slice of every sequence).

Every forward and backward of a sharded model is a collective, so all ranks run the same passes:
the scorers carry the world as their `lockstep_group`, each scorer call is exactly one forward,
the token-budget passes of every rank pad to the group's count
(`dllm_train.lockstep`), and a step is skipped on every rank or on none.

The same object runs inside a Ray actor (`ray_backend`) or a torchrun process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dllm_rollout import SamplingConfig
from dllm_train.algorithm import RLAlgorithm
from dllm_train.assembly import assemble_rank
from dllm_train.rollout_record import RolloutSaver
from dllm_train.config import OptimConfig, TrainerConfig
from dllm_train.dataflow import map_tensors
from dllm_train.distributed.fsdp import (
    broadcast_parameters,
    full_state_dict,
    handoff_state_dict,
    load_full_optimizer_state,
    load_full_state_dict,
    load_sharded_state,
    save_sharded_state,
    shard_model,
)
from dllm_train.distributed.parallel_dims import ParallelDims, sequence_parallel_group
from dllm_train.distributed.sequence_parallel import SequenceParallelScorer
from dllm_train.likelihood import Scorer
from dllm_train.seeding import generator
from dllm_train.step import PolicyRank, RankRollout, shard_rows
from dllm_train.workers import ActorWorker, RewardWorker


@dataclasses.dataclass
class RankSetup:
    """What one rank builds its workers from (returned by a picklable factory on each rank).

    Attributes:
        model: the initial policy, unsharded, on CPU (rank 0's weights are broadcast).
        sampling: rollout sampling config.
        reward_fn: (text, answer) -> reward.
        detokenize: token ids -> text.
        algorithm: the RL algorithm.
        optim: actor optimizer config.
        trainer: seed, token budget, training attention, memory levers, consistency period.
        engine_folder: the checkpoint folder an inference engine loads (`rollout.engine`).
        run_dir: the run folder, where `trainer.save_rollouts_every` stores each data-parallel
            group's rollout records (`rollouts/step_XXXXXX.rankR.safetensors`, R its group).
    """

    model: Any
    sampling: SamplingConfig
    reward_fn: Callable[[str, str], float]
    detokenize: Callable[[list[int]], str]
    algorithm: RLAlgorithm[Any]
    optim: OptimConfig
    trainer: TrainerConfig
    engine_folder: str | None = None
    run_dir: str | None = None


def select_rows(value: Any, rows: torch.Tensor, batch: int) -> Any:
    """`value` restricted to `rows` of a batch of `batch` samples: every tensor whose first dim
    is `batch` is indexed (see `map_tensors` for what is walked)."""
    return map_tensors(value, lambda t: t[rows] if t.dim() and t.shape[0] == batch else t)


class RankWorker:
    """The workers of one rank; call its methods on every rank in the same order.

    Its workers come from `dllm_train.assemble_rank`, the rule of the local backend too, with
    FSDP2 sharding and lockstep (or sequence-parallel) scorers as its hooks.

    Args:
        setup: what the workers are built from.
        device: this rank's device.
        param_dtype: FSDP2 compute dtype (None: the stored dtype).
        sequence_parallel: ranks that split every sequence (must divide the world size; the Ray
            driver passes its `trainer.sequence_parallel`).
    """

    def __init__(self, setup: RankSetup, *, device: torch.device | str = "cpu",
                 param_dtype: torch.dtype | None = None, sequence_parallel: int = 1) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        trainer = setup.trainer
        self.dims = ParallelDims(world_size=self.world_size, sequence_parallel=sequence_parallel)
        self.sp_group = sequence_parallel_group(self.dims, self.rank)
        self.seed = trainer.seed
        self.algorithm = setup.algorithm
        self.param_dtype = param_dtype
        self.device = torch.device(device)
        model = setup.model.to(device)
        broadcast_parameters(model)
        self.policy: PolicyRank[Any] = assemble_rank(
            model, sampling=setup.sampling, algorithm=setup.algorithm, optim=setup.optim, trainer=trainer,
            reward=RewardWorker(setup.reward_fn, setup.detokenize), plan_generator=self._plan_generator,
            engine_folder=setup.engine_folder, shard=self._shard, scorer=self._scorer,
            generates=self.dims.sp_rank(self.rank) == 0, share=self._from_leader if self.sp_group is not None else None,
            save_rollout=self._rollout_saver(setup))
        self.actor: ActorWorker[Any] = self.policy.actor
        self.model = self.actor.model
        self.rollout = self.policy.rollout
        self.handoff_keys: list[str] = []

    def _shard(self, model: Any, *, offload: bool) -> Any:
        return shard_model(model, param_dtype=self.param_dtype, cpu_offload=offload)

    def _scorer(self, model: Any, *, kind: type[Scorer], attention: str | None, shared_context: bool) -> Scorer:
        # every forward of the sharded model is a collective over the world: ranks run passes in lockstep
        world = dist.group.WORLD
        if self.dims.sequence_parallel == 1:
            return kind(model, lockstep_group=world, attention=attention, shared_context=shared_context)
        if kind is Scorer:
            return SequenceParallelScorer(model, self.sp_group, lockstep_group=world)
        # the Ulysses split runs on the padded batch: so does a scorer that does not split (LoRA's base weights)
        return kind(model, lockstep_group=world, attention=None, shared_context=shared_context)

    def _rollout_saver(self, setup: RankSetup) -> RolloutSaver | None:
        """The store of `trainer.save_rollouts_every` for this rank's data-parallel group (None when off)."""
        every = setup.trainer.save_rollouts_every
        if not every:
            return None
        if setup.run_dir is None:
            raise ValueError(f"trainer.save_rollouts_every={every} stores rollouts in the run folder: "
                             "pass RankSetup(..., run_dir=<run folder>)")
        return RolloutSaver(setup.run_dir, every, rank=self.dims.dp_rank(self.rank))

    def _plan_generator(self, step: int) -> torch.Generator:
        if self.dims.data_parallel == 1:  # one data-parallel group draws exactly what one process draws
            return generator(self.seed, "plan", step)
        return generator(self.seed, "plan", step, "rank", self.dims.dp_rank(self.rank))

    def _from_leader(self, payload: Any) -> Any:
        """The sequence-parallel leader's `payload`, on every rank of its group (CPU in transit)."""
        box = [map_tensors(payload, lambda t: t.cpu())]
        leader = self.dims.sp_ranks(self.dims.dp_rank(self.rank))[0]
        dist.broadcast_object_list(box, src=leader, group=self.sp_group)
        return map_tensors(box[0], lambda t: t.to(self.device))

    def rollout_step(self, step: int, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                     seeds: torch.Tensor, groups: torch.Tensor) -> RankRollout:
        """Generate, score, prepare (old and reference values) this rank's rows (`PolicyRank`).

        With sequence parallelism every rank of a group gets the group's rows; only the leader
        generates and scores them.
        """
        return self.policy.rollout_step(step, prompts, answers, seeds, groups)

    def update(self, advantages: torch.Tensor) -> dict[str, float]:
        """One FSDP2 update on this rank's rows, then the weight hand-off to the rollout replica
        (only the adapter weights when the model has LoRA adapters)."""
        metrics = self.policy.update(advantages)
        state = handoff_state_dict(self.model)
        self.rollout.load_weights(state)
        self.handoff_keys = sorted(state)
        return metrics

    def handoff_report(self) -> dict[str, Any]:
        """Keys of the last weight hand-off and the largest |rollout replica - actor| weight; a collective."""
        full = full_state_dict(self.model)
        own = self.rollout.model.state_dict()
        gap = max(float((own[k].float() - v.float()).abs().max()) for k, v in full.items())
        return {"keys": list(self.handoff_keys), "num_weights": len(full), "max_abs_gap": gap}

    def load_weights(self, full: dict[str, torch.Tensor]) -> None:
        """Set the actor and its rollout replica to `full` (given on rank 0, {} elsewhere), e.g. a
        resumed checkpoint's weights; the reference copies keep the initial policy. A collective."""
        load_full_state_dict(self.model, full)
        self.rollout.load_weights(full_state_dict(self.model))

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Full CPU weights on rank 0 ({} elsewhere); a collective."""
        return full_state_dict(self.model, cpu=True)

    def state(self) -> dict[str, Any]:
        """The update counters (parameters and optimizer state go to `save_shards`)."""
        return {"updates": self.actor.updates, "skipped": self.actor.skipped}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`. A state holding "optimizer" (rank 0's full optimizer state, as
        checkpoints written before sharded checkpoints hold it) is broadcast: a collective then."""
        self.actor.optim.restore()  # an offloaded state is loaded into, never around
        if "optimizer" in state:
            load_full_optimizer_state(self.model, self.actor.optimizer, state["optimizer"])
        self.actor.optim.load_counters(state)

    def save_shards(self, folder: str) -> None:
        """Write this rank's shards of the actor's parameters and optimizer state into `folder`
        (`fsdp.save_sharded_state`: nothing gathered); a collective."""
        self.actor.optim.restore()
        save_sharded_state(self.model, self.actor.optimizer, folder)

    def load_shards(self, folder: str) -> None:
        """Inverse of `save_shards`, then the rollout replica takes the loaded weights; a collective."""
        self.actor.optim.restore()  # DCP loads in place
        load_sharded_state(self.model, self.actor.optimizer, folder)
        self.rollout.load_weights(full_state_dict(self.model))


__all__ = ["RankSetup", "RankWorker", "map_tensors", "select_rows", "shard_rows"]
