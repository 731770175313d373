"""One data-parallel rank: the plain workers of `dllm_train.workers` around an FSDP2 policy.

A rank holds three views of the policy: the FSDP2-sharded actor (trained), an unsharded rollout
replica on the same device (generation; refreshed with the gathered full weights after every
update) and, if the objective needs one, an FSDP2-sharded frozen reference. Generating from the
unsharded replica keeps decoding free of collectives, so ranks may run different numbers of
denoising steps without deadlocking; its cost is one extra copy of the weights per device.

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
    load_full_optimizer_state,
    shard_model,
)
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


def select_rows(value: Any, rows: torch.Tensor, batch: int) -> Any:
    """`value` restricted to `rows` of a batch of `batch` samples: every tensor whose first dim
    is `batch` is indexed; dataclasses (MaskPlan, RolloutBatch), lists, tuples and dicts are
    walked; anything else is kept."""
    if isinstance(value, torch.Tensor):
        return value[rows] if value.dim() and value.shape[0] == batch else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: select_rows(getattr(value, f.name), rows, batch)
                   for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, (list, tuple)):
        return type(value)(select_rows(v, rows, batch) for v in value)
    if isinstance(value, dict):
        return {k: select_rows(v, rows, batch) for k, v in value.items()}
    return value


def shard_rows(batch: int, world_size: int, rank: int) -> slice:
    """Contiguous rows of `rank` when `batch` samples are split over `world_size` ranks."""
    if batch % world_size:
        raise ValueError(f"rollout batch {batch} (prompts_per_step x group_size) must be divisible by "
                         f"the number of workers {world_size}")
    per = batch // world_size
    return slice(rank * per, (rank + 1) * per)


class RankWorker:
    """The workers of one rank; call its methods on every rank in the same order."""

    def __init__(self, setup: RankSetup, *, device: torch.device | str = "cpu",
                 param_dtype: torch.dtype | None = None) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.seed = setup.seed
        self.objective = setup.objective
        model = setup.model.to(device)
        broadcast_parameters(model)
        self.device = torch.device(device)
        replica = copy.deepcopy(model)
        reference = copy.deepcopy(model) if setup.objective.needs_reference else None
        self.model = shard_model(model, param_dtype=param_dtype)
        self.actor = ActorWorker(self.model, setup.objective, setup.optim)
        self.rollout = RolloutWorker(replica, setup.sampling, objective=setup.objective)
        self.reward = RewardWorker(setup.reward_fn, setup.detokenize)
        self.reference = None if reference is None else ReferenceWorker(shard_model(reference, param_dtype=param_dtype))
        self.exp: Experience | None = None

    def _plan_generator(self, step: int) -> torch.Generator:
        if self.world_size == 1:  # one worker draws exactly what the local workflow draws
            return generator(self.seed, "plan", step)
        return generator(self.seed, "plan", step, "rank", self.rank)

    def rollout_step(self, step: int, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                     seeds: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """Generate, score, sample the plan and the old (and reference) log-probs of this rank's rows.

        Returns:
            (scores [b], response lengths [b], texts) of this rank's b = B/N rows.
        """
        rollout = self.rollout.generate(prompts, seeds)
        scores, texts = self.reward.score(rollout, answers)
        exp = Experience(rollout=rollout, scores=scores, group_ids=groups, texts=texts)
        self.actor.prepare(exp, self._plan_generator(step))
        if self.reference is not None:
            exp.ref_logp = self.reference.log_probs(exp, self.objective)
        self.exp = exp
        return scores, rollout.response_mask.float().sum(-1), texts

    def update(self, advantages: torch.Tensor) -> dict[str, float]:
        """One FSDP2 update on this rank's rows, then the weight hand-off to the rollout replica."""
        assert self.exp is not None, "rollout_step must run before update"
        self.exp.advantages = advantages.to(self.exp.scores.device)
        metrics = self.actor.update(self.exp)
        self.rollout.load_weights(full_state_dict(self.model))
        self.exp = None
        return metrics

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


__all__ = ["RankSetup", "RankWorker", "select_rows", "shard_rows"]
