"""One rank: the plain workers of `dllm_train.workers` around an FSDP2 policy.

A rank holds three views of the policy: the FSDP2-sharded actor (trained), an unsharded rollout
replica on the same device (generation; refreshed after every update with the gathered weights,
only the adapters when the model has LoRA adapters) and, if the objective needs one, an
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
objectives with a data-dependent number of passes pad to the group's count
(`dllm_train.lockstep`), and a step is skipped on every rank or on none.

The same object runs inside a Ray actor (`ray_backend`) or a torchrun process.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from dllm_rollout import SamplingConfig
from dllm_train.config import OptimConfig
from dllm_train.dataflow import Experience
from dllm_train.distributed.fsdp import (
    broadcast_parameters,
    full_optimizer_state,
    full_state_dict,
    handoff_state_dict,
    load_full_optimizer_state,
    load_full_state_dict,
    shard_model,
)
from dllm_train.distributed.parallel_dims import ParallelDims, sequence_parallel_group
from dllm_train.distributed.sequence_parallel import SequenceParallelScorer
from dllm_train.likelihood import Scorer
from dllm_train.objective import PolicyObjective
from dllm_train.seeding import generator
from dllm_train.workers import ActorWorker, ReferenceWorker, RewardWorker, RolloutWorker


@dataclasses.dataclass
class RankSetup:
    """What one rank builds its workers from (returned by a picklable factory on each rank).

    Attributes:
        model: the initial policy, unsharded, on CPU (rank 0's weights are broadcast).
        sampling: rollout sampling config.
        reward_fn: (text, answer) -> reward.
        detokenize: token ids -> text.
        objective: the policy objective.
        optim: actor optimizer config.
        seed: the trainer's root seed.
    """

    model: Any
    sampling: SamplingConfig
    reward_fn: Callable[[str, str], float]
    detokenize: Callable[[list[int]], str]
    objective: PolicyObjective
    optim: OptimConfig
    seed: int


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` with `fn` applied to every tensor: dataclasses (MaskPlan, RolloutBatch), lists,
    tuples and dicts are walked; anything else is kept."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: map_tensors(getattr(value, f.name), fn) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def select_rows(value: Any, rows: torch.Tensor, batch: int) -> Any:
    """`value` restricted to `rows` of a batch of `batch` samples: every tensor whose first dim
    is `batch` is indexed (see `map_tensors` for what is walked)."""
    return map_tensors(value, lambda t: t[rows] if t.dim() and t.shape[0] == batch else t)


def shard_rows(batch: int, world_size: int, rank: int) -> slice:
    """Contiguous rows of `rank` when `batch` samples are split over `world_size` ranks."""
    if batch % world_size:
        raise ValueError(f"rollout batch {batch} (prompts_per_step x group_size) must be divisible by "
                         f"the number of workers {world_size}")
    per = batch // world_size
    return slice(rank * per, (rank + 1) * per)


class RankWorker:
    """The workers of one rank; call its methods on every rank in the same order.

    Args:
        setup: what the workers are built from.
        device: this rank's device.
        param_dtype: FSDP2 compute dtype (None: the stored dtype).
        sequence_parallel: ranks that split every sequence (must divide the world size).
    """

    def __init__(self, setup: RankSetup, *, device: torch.device | str = "cpu",
                 param_dtype: torch.dtype | None = None, sequence_parallel: int = 1) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.dims = ParallelDims(world_size=self.world_size, sequence_parallel=sequence_parallel)
        self.sp_group = sequence_parallel_group(self.dims, self.rank)
        self.seed = setup.seed
        obj = self.objective = setup.objective
        model = setup.model.to(device)
        broadcast_parameters(model)
        self.device = torch.device(device)
        replica = copy.deepcopy(model)
        frozen = _frozen_copy(model) if obj.needs_rollout_reference else None
        reference = copy.deepcopy(model) if obj.needs_reference else None
        self.model = shard_model(model, param_dtype=param_dtype)
        self.actor = ActorWorker(self.model, obj, setup.optim, scorer=self._scorer(self.model))
        self.rollout = RolloutWorker(replica, setup.sampling, objective=obj, ref_model=frozen)
        self.reward = RewardWorker(setup.reward_fn, setup.detokenize)
        self.reference = None
        if reference is not None:
            reference = shard_model(reference, param_dtype=param_dtype)
            self.reference = ReferenceWorker(reference, scorer=self._scorer(reference))
        self.exp: Experience | None = None
        self.handoff_keys: list[str] = []

    def _scorer(self, model: Any) -> Scorer:
        # every forward of the sharded model is a collective over the world: ranks run passes in lockstep
        world = dist.group.WORLD
        if self.dims.sequence_parallel == 1:
            return Scorer(model, lockstep_group=world)
        return SequenceParallelScorer(model, self.sp_group, lockstep_group=world)

    def _plan_generator(self, step: int) -> torch.Generator:
        if self.dims.data_parallel == 1:  # one data-parallel group draws exactly what the local workflow draws
            return generator(self.seed, "plan", step)
        return generator(self.seed, "plan", step, "rank", self.dims.dp_rank(self.rank))

    def _from_leader(self, payload: Any) -> Any:
        """The sequence-parallel leader's `payload`, on every rank of its group (CPU in transit)."""
        box = [map_tensors(payload, lambda t: t.cpu())]
        leader = self.dims.sp_ranks(self.dims.dp_rank(self.rank))[0]
        dist.broadcast_object_list(box, src=leader, group=self.sp_group)
        return map_tensors(box[0], lambda t: t.to(self.device))

    def rollout_step(self, step: int, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                     seeds: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Generate, score, sample the plan and the old (and reference) log-probs of this rank's rows.

        With sequence parallelism every rank of a group gets the group's rows; only the leader
        generates and scores them.

        Returns:
            (scores [b], response lengths [b], texts) of this rank's b = B/D rows.
        """
        payload = None
        if self.dims.sp_rank(self.rank) == 0:
            rollout = self.rollout.generate(prompts, seeds)
            payload = (rollout, *self.reward.score(rollout, answers))
        if self.sp_group is not None:
            payload = self._from_leader(payload)
        assert payload is not None
        rollout, scores, texts = payload
        exp = Experience(rollout=rollout, scores=scores, group_ids=groups, texts=texts)
        self.actor.prepare(exp, self._plan_generator(step))
        if self.reference is not None:
            exp.ref_logp = self.reference.log_probs(exp, self.objective)
        self.exp = exp
        return scores, rollout.response_mask.float().sum(-1), texts

    def update(self, advantages: torch.Tensor) -> dict[str, float]:
        """One FSDP2 update on this rank's rows, then the weight hand-off to the rollout replica
        (only the adapter weights when the model has LoRA adapters)."""
        assert self.exp is not None, "rollout_step must run before update"
        self.exp.advantages = advantages.to(self.exp.scores.device)
        metrics = self.actor.update(self.exp)
        state = handoff_state_dict(self.model)
        self.rollout.load_weights(state)
        self.handoff_keys = sorted(state)
        self.exp = None
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
        """Optimizer state gathered on rank 0 plus the update counters; a collective."""
        return {"optimizer": full_optimizer_state(self.model, self.actor.optimizer),
                "updates": self.actor.updates, "skipped": self.actor.skipped}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state` (rank 0's optimizer state is broadcast); a collective."""
        load_full_optimizer_state(self.model, self.actor.optimizer, state["optimizer"])
        self.actor.updates = int(state["updates"])
        self.actor.skipped = int(state["skipped"])


def _frozen_copy(model: Any) -> Any:
    frozen = copy.deepcopy(model).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


__all__ = ["RankSetup", "RankWorker", "map_tensors", "select_rows", "shard_rows"]
