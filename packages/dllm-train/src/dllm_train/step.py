"""One RL step for every backend: the driver's half over a `Ranks` interface, the rank's half in
`PolicyRank`.

The driver (`rl_step`) expands the step's prompts and per-sample seeds, gives each data-parallel
group its rows, gathers the rewards, computes the advantages on the whole batch (groups may
straddle ranks) and hands each rank its share; each rank (`PolicyRank`) generates, scores,
prepares (shared noise, old and reference values, in token-budget passes) and updates. A single
process is one rank (`LocalRanks`); Ray runs one `PolicyRank` per actor
(`dllm_train.distributed`). Validation (`check_settings`) and metrics are the same on both.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch

from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train.metrics import device_peak, is_peak
from dllm_train.algorithm import Prepared, RLAlgorithm, RLBatch
from dllm_train.critic import ValueWorker
from dllm_train.dataflow import PromptBatch
from dllm_train.rollout_record import check_rollout_filled
from dllm_train.seeding import sample_seeds
from dllm_train.workers import ActorWorker, ReferenceWorker, RewardWorker, Rollout, special_tokens

logger = logging.getLogger(__name__)
D = TypeVar("D")
PromptSampler = Callable[[int], PromptBatch]
"""step -> the prompts of that step (deterministic in step)."""
RolloutArgs = tuple[int, Sequence[Sequence[int]], Sequence[str], torch.Tensor, torch.Tensor]
"""The arguments of one rank's `PolicyRank.rollout_step`: step, prompts, answers, seeds [b], groups [b]."""

logger = logging.getLogger(__name__)


def check_settings(algorithm: RLAlgorithm[Any], sampling: SamplingConfig, *, consistency_every: int) -> None:
    """Raise before any work on settings no step can honour (field, value and fix in the message)."""
    rows = algorithm.mini_batch_rows
    if rows not in ("all", "rollout", "prompts"):
        raise ValueError(f"algorithm {algorithm.label}: mini_batch_rows={rows!r} is not "
                         "one of 'all', 'rollout', 'prompts'")
    if rows != "all" and (type(algorithm).select_rows is RLAlgorithm.select_rows
                          or type(algorithm).num_rows is RLAlgorithm.num_rows):
        raise ValueError(f"algorithm {algorithm.label} trains in mini-batches "
                         f"(mini_batch_rows={rows!r}) but defines no num_rows / select_rows to cut its data")
    if algorithm.critic is not None and rows != "all":
        raise ValueError(f"algorithm {algorithm.label} trains a value model, whose targets cover every training row "
                         f"of a step, but splits its rows into mini-batches (mini_batch_rows={rows!r}): give it "
                         "mini_batch_rows='all' or no value model")
    if algorithm.zero_gradient_under(sampling):
        raise ValueError(
            "rollout.temperature=0 decodes greedily with a deterministic unmasking order "
            f"(rollout.remasking={sampling.remasking!r}), so every sample of a group is the same response and "
            f"algorithm {algorithm.label}'s policy gradient is identically zero: set rollout.temperature > 0 (e.g. 1.0)")
    if consistency_every and sampling.engine == "native" and not sampling.record_trajectory:
        # native rollouts replay their trajectory; engine rollouts compare a greedy probe instead
        raise ValueError(
            f"trainer.consistency_every={consistency_every} needs recorded trajectories; "
            "set rollout.record_trajectory=true (or trainer.consistency_every=0)"
        )
    if sampling.editing_threshold is not None and (algorithm.replays_trajectory or consistency_every):
        why = (f"algorithm {algorithm.label} reads the rollout's trajectory" if algorithm.replays_trajectory
               else f"trainer.consistency_every={consistency_every} replays it")
        raise ValueError(
            f"{why}, but rollout.editing_threshold={sampling.editing_threshold} lets the decoder "
            "rewrite committed tokens, which no step replay reproduces: unset rollout.editing_threshold, "
            "or use an algorithm that does not read trajectories (and trainer.consistency_every=0)"
        )


@dataclass(frozen=True)
class RankRollout:
    """What a rank reports after its rollout: rewards [b], response lengths [b], metrics."""

    scores: torch.Tensor
    lengths: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class PolicyRank(Generic[D]):
    """One rank's workers and its half of a step (the same object locally and on Ray).

    Args:
        rollout, reward, actor: the workers (the rollout model may be the actor's, locally).
        reference: the reference worker, for algorithms with `needs_reference`.
        plan_generator: step -> the generator of this rank's `prepare` noise.
        consistency_every: every N steps, before the update, report the rollout worker's
            `consistency` with the trainer's model (0: never).
        share: hands the rollout of a sequence-parallel group's leader to the other ranks of the
            group (identity without sequence parallelism); `generates` says whether this rank
            decodes.
        save_rollout: (step, rollout) -> None, called with every rollout this rank decodes
            (`dllm_train.RolloutSaver`, `trainer.save_rollouts_every`); None: nothing stored.
        critic: the value model's worker, for algorithms with a value model (`RLAlgorithm.critic`).
    """

    def __init__(self, *, rollout: Rollout, reward: RewardWorker, actor: ActorWorker[D],
                 reference: ReferenceWorker | None, plan_generator: Callable[[int], torch.Generator],
                 consistency_every: int = 0, generates: bool = True,
                 share: Callable[[Any], Any] | None = None,
                 save_rollout: Callable[[int, RolloutBatch], None] | None = None,
                 critic: ValueWorker[D] | None = None) -> None:
        algorithm = actor.algorithm
        if algorithm.needs_reference and reference is None:
            raise ValueError(f"algorithm {algorithm.label} needs a reference model; pass reference=")
        if (algorithm.critic is None) != (critic is None):
            raise ValueError(f"algorithm {algorithm.label} " + ("trains a value model; pass critic=ValueWorker(...)"
                             if critic is None else "has no value model; pass critic=None"))
        check_settings(algorithm, rollout.sampling, consistency_every=consistency_every)
        self.rollout = rollout
        self.reward = reward
        self.actor = actor
        self.reference = reference
        self.plan_generator = plan_generator
        self.consistency_every = consistency_every
        self.generates = generates
        self.share = share
        self.save_rollout = save_rollout
        self.critic = critic
        self.prepared: Prepared[D] | None = None
        self.old_values: torch.Tensor | None = None
        self.step = 0
        self.carried: dict[str, float] = {}

    def rollout_step(self, step: int, prompts: Sequence[Sequence[int]], answers: Sequence[str],
                     seeds: torch.Tensor, groups: torch.Tensor) -> RankRollout:
        """Generate, score and prepare this rank's rows (old and reference values included).

        Its metrics include the seconds of each part (`rollout_s`, `old_s`, `reference_s`, and
        `optimizer_offload_s` with `trainer.optimizer_offload`) and the memory peaks of this phase
        (`rollout_peak_gib` on CUDA, `rollout_peak_rss_gib`), both reported by `update` with its own.
        """
        payload: tuple[RolloutBatch, RLBatch] | None = None
        metrics: dict[str, float] = {}
        # the last update's gradients are spent: free them before the rollout, which would otherwise
        # decode beside a model's worth of them (15 GiB at 8B in bf16); the optimizer state is not
        # read until the next optimizer step, so it may wait in host memory
        self.actor.release_gradients()
        clock = _Clock()
        if self.actor.offload_optimizer():
            metrics["optimizer_offload_s"] = clock.lap()
        if self.critic is not None and self.critic.offload_optimizer():
            metrics["value_optimizer_offload_s"] = clock.lap()
        device_peak()  # the peaks below start with the step
        if self.generates:
            rollout = self.rollout.generate(prompts, seeds)
            metrics["rollout_s"] = clock.lap()
            check_rollout_filled(self.actor.algorithm, rollout)
            if self.save_rollout is not None:
                self.save_rollout(step, rollout)
            metrics.update(self.rollout.last_metrics)
            batch = self.reward.score(rollout, answers, groups, special_tokens(self.rollout.model))
            every = self.consistency_every
            if every and (step + 1) % every == 0:
                # the replay of the rollout with the weights that generated it (before the update)
                gap = self.rollout.consistency(rollout)
                metrics.update({f"consistency_{k}": v for k, v in gap.items()})
            payload = (rollout, batch)
        if self.share is not None:
            payload, metrics = self.share((payload, metrics))
        assert payload is not None
        rollout, batch = payload
        clock.lap()
        prepared = self.actor.prepare(batch, self.plan_generator(step))
        metrics["old_s"] = clock.lap()
        if self.reference is not None:
            from dataclasses import replace

            prepared = replace(prepared, ref=self.reference.values(self.actor.algorithm, prepared))
            metrics["reference_s"] = clock.lap()
        if self.critic is not None:
            self.old_values = self.critic.old_values(prepared)
            metrics["value_old_s"] = clock.lap()
        self.prepared, self.step = prepared, step
        self.carried = {k: v for k, v in metrics.items() if k.endswith("_s")}
        self.carried.update(device_peak("rollout_"))
        return RankRollout(scores=batch.scores, lengths=rollout.response_mask.float().sum(-1),
                           metrics={k: v for k, v in metrics.items() if not k.endswith("_s")})

    def update(self, advantages: torch.Tensor) -> dict[str, float]:
        """The actor's update on this rank's prepared rows; its metrics carry this rank's timings
        and memory peaks: those of the rollout phase, of the update (`update_peak_gib`,
        `update_peak_rss_gib`) and of the whole step (`peak_gib`, `peak_rss_gib`)."""
        assert self.prepared is not None, "rollout_step must run before update"
        prepared, self.prepared = self.prepared, None
        clock = _Clock()
        advantages = advantages.to(prepared.batch.rollout.response_mask.device)
        if self.critic is None:
            out = self.actor.update(prepared, advantages)
            out.update(self.carried, update_s=clock.lap())
        else:
            out = self._actor_critic_update(prepared, advantages, clock)
        out.update(device_peak("update_"))
        for key in ("peak_gib", "peak_rss_gib"):
            phases = [out[k] for k in (f"rollout_{key}", f"update_{key}") if k in out]
            if phases:
                out[key] = max(phases)
        return out

    def _actor_critic_update(self, prepared: Prepared[D], advantages: torch.Tensor, clock: _Clock) -> dict[str, float]:
        """The policy's update with the targets of the value model's old values, then (when due) the
        value model's own (`dllm_train.critic`); `value_update_s` times the latter."""
        assert self.critic is not None and self.old_values is not None
        old, self.old_values = self.old_values, None
        targets = self.critic.targets(prepared, old, advantages)
        out = self.actor.update(prepared, advantages, critic=targets)
        out.update(self.carried, update_s=clock.lap())
        if self.critic.due(self.step):
            # the policy's gradients are spent and its optimizer state is not read before its next step:
            # with `trainer.optimizer_offload` it waits in host memory while the value model trains (the
            # rollout_step's offload then finds it there), so the two optimizer states never share the device
            self.actor.release_gradients()
            if self.actor.offload_optimizer():
                out["optimizer_offload_before_value_s"] = clock.lap()
            out.update(self.critic.update(prepared, old, targets))
            out["value_update_s"] = clock.lap()
        return out


class _Clock:
    """Seconds between laps (the device synchronised first, so GPU work is counted where it ran)."""

    def __init__(self) -> None:
        self.t = self._now()

    @staticmethod
    def _now() -> float:
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self) -> float:
        now = self._now()
        out, self.t = now - self.t, now
        return out


class Ranks(Protocol):
    """The ranks of a run, seen from the driver: `data_parallel` groups of rows, and the calls."""

    @property
    def data_parallel(self) -> int: ...

    def group_of(self, rank: int) -> int:
        """The data-parallel group of `rank`."""
        ...

    @property
    def size(self) -> int: ...

    def rollout(self, args: list[RolloutArgs]) -> list[RankRollout]:
        """Rank r's `PolicyRank.rollout_step(*args[r])`, by rank."""
        ...

    def update(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
        """Rank r's `PolicyRank.update(advantages[r])`, by rank."""
        ...


class LocalRanks:
    """One process: a single `PolicyRank`."""

    def __init__(self, rank: PolicyRank[Any]) -> None:
        self.rank = rank

    data_parallel = 1
    size = 1

    def group_of(self, rank: int) -> int:
        return 0

    def rollout(self, args: list[RolloutArgs]) -> list[RankRollout]:
        return [self.rank.rollout_step(*args[0])]

    def update(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
        return [self.rank.update(advantages[0])]


def shard_rows(batch: int, groups: int, group: int) -> slice:
    """Contiguous rows of data-parallel group `group` when `batch` samples are split over `groups`."""
    if batch % groups:
        raise ValueError(f"rollout batch {batch} (prompts_per_step x group_size) must be divisible by "
                         f"the number of data-parallel groups {groups}")
    per = batch // groups
    return slice(group * per, (group + 1) * per)


def all_equal_groups(scores: torch.Tensor, groups: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    equal = [bool((scores[groups == g] == scores[groups == g][0]).all()) for g in torch.unique(groups)]
    return sum(equal) / max(1, len(equal))


def rl_step(step: int, *, prompts: PromptSampler, ranks: Ranks, algorithm: RLAlgorithm[Any],
            seed: int) -> dict[str, float]:
    """One RL step on `ranks`: rollout, rewards, advantages on the whole batch, update; its metrics.

    Per-rank metrics are averaged over ranks (the peak memory is the largest rank's); reward
    statistics are over the whole batch. A batch with a non-finite reward is not trained on: the
    step is skipped before any update (`skipped` 1, `reward_nonfinite` the number of such rows)
    and the rows are named in one warning.
    """
    expanded, answers, groups = prompts(step).expanded()
    seeds = sample_seeds(seed, len(expanded), "rollout", step)
    rows = [shard_rows(len(expanded), ranks.data_parallel, ranks.group_of(r)) for r in range(ranks.size)]
    outs = ranks.rollout([(step, expanded[s], answers[s], seeds[s], groups[s]) for s in rows])
    firsts = [outs[r] for r in range(ranks.size) if r == 0 or ranks.group_of(r) != ranks.group_of(r - 1)]
    scores = torch.cat([o.scores.cpu() for o in firsts])
    lengths = torch.cat([o.lengths.cpu() for o in firsts])
    if not bool(torch.isfinite(scores).all()):
        return _skip_for_rewards(step, scores, lengths, answers)
    advantages = algorithm.advantages(scores, groups)
    per_rank = ranks.update([advantages[s] for s in rows])
    metrics = {k: (max(m[k] for m in per_rank) if is_peak(k) else sum(m[k] for m in per_rank) / len(per_rank))
               for k in per_rank[0]}
    for o in firsts:  # consistency gaps of the groups' rows, averaged
        for k, v in o.metrics.items():
            metrics[k] = metrics.get(k, 0.0) + v / len(firsts)
    metrics.update({
        "reward_mean": float(scores.mean()),
        "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "response_length": float(lengths.mean()),
        "groups_all_equal": all_equal_groups(scores, groups),
    })
    if metrics["groups_all_equal"] == 1.0 and not bool(advantages.any()):
        logger.warning("RL step %d: every group's rewards are equal (reward_mean %.3g), so every advantage is 0 "
                       "and this step has no learning signal; if it persists, the prompts are too hard or too "
                       "easy for the model: raise rl.group_size or rollout.temperature, or change the data",
                       step + 1, metrics["reward_mean"])
    return metrics


def _skip_for_rewards(step: int, scores: torch.Tensor, lengths: torch.Tensor, answers: Sequence[str]) -> dict[str, float]:
    """The metrics of a step skipped before its update because the reward function returned a
    non-finite reward: weights and optimizer state unchanged, the rows named in one warning.
    `reward_nonfinite` (the number of such rows) tells `Run` the weights are not to blame."""
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    shown = ", ".join(f"{i} ({answers[i]!r}: {float(scores[i])})" for i in bad[:8]) + (" ..." if len(bad) > 8 else "")
    logger.warning("rl step %d skipped: reward non-finite in rows %s of the step's %d (row: answer or data key, "
                   "reward); the reward function returned NaN or inf for them, so no update was made (weights and "
                   "optimizer state unchanged). Fix the reward function or those rows' ground truth",
                   step + 1, shown, len(scores))
    finite = scores[torch.isfinite(scores)]
    return {"skipped": 1.0, "optimizer_steps": 0.0, "reward_nonfinite": float(len(bad)),
            "reward_mean": float(finite.mean()) if finite.numel() else math.nan,
            "response_length": float(lengths.mean())}


__all__ = ["LocalRanks", "PolicyRank", "PromptSampler", "RankRollout", "Ranks", "RolloutArgs", "all_equal_groups",
           "check_settings", "rl_step", "shard_rows"]
