"""The generic policy objective: what the trainer needs to know about an algorithm.

An algorithm is data: the app builds a `PolicyObjective` from pure functions of dllm_objectives,
and the workers only call its fields; they never look at its name. Each field is one concern:

- `sampling_overrides` / `rollout`: what the rollout must record (or a different rollout, e.g.
  a tree search) on top of the run's SamplingConfig.
- `prepare`: derive per-batch data from the rollout and rewards (training rows, step or tree
  advantages, importance weights), stored in `Experience.extras`.
- `sample_plan`: the noise shared by the old, reference and current passes (common random
  numbers), drawn once per batch with an explicit generator.
- `score`: the values the loss compares (token log-probs, ELBOs, ...) from a `Scorer`.
- `advantages`: outcome advantages from rewards and group ids.
- `loss`: values, old values, advantages, experience -> (scalar, metrics).
- `update`: an optional backward strategy for algorithms that interleave forward and backward
  (per-sample backward, proxy backward, step replay); it calls backward itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train.dataflow import Experience
from dllm_train.likelihood import Scorer

Metrics = dict[str, torch.Tensor]
ScoreStep = Callable[[Scorer, Experience], torch.Tensor]
LossFn = Callable[..., tuple[torch.Tensor, Metrics]]
"""(values, old_values, advantages, exp) -> (scalar loss, metrics)."""
UpdateFn = Callable[["PolicyObjective", Scorer, Experience], tuple[torch.Tensor, Metrics]]
"""Runs the forward passes and calls backward itself; returns the detached loss and metrics."""
RolloutFn = Callable[[Any, torch.Tensor, torch.Tensor, torch.Tensor, SamplingConfig, Any], RolloutBatch]
"""(model, prompt_ids, prompt_mask, seeds, sampling, ref_model) -> RolloutBatch."""


@dataclass(frozen=True)
class PolicyObjective:
    """An RL algorithm as data (see the module docstring for each field).

    Attributes:
        name: the algorithm's registry key (for logs and errors only).
        score: current-policy values used by `loss`; also run without grad for old/ref values.
        advantages: (scores [B], group_ids [B]) -> advantages.
        loss: (values, old_values, advantages, exp) -> (loss, metrics).
        sample_plan: (rollout, generator) -> plan, or None when the objective needs no noise.
        prepare: (exp, generator) -> None, fills `exp.extras` before the old pass.
        update: backward strategy (default: one backward of `loss(score(...))`).
        sampling_overrides: SamplingConfig fields the rollout must use (e.g. record_steps).
        rollout: a replacement rollout function (None: the standard decoder).
        needs_reference: the workflow must run a ReferenceWorker.
        needs_old: compute old values at prepare time (False for REINFORCE-style losses).
        num_iterations: optimizer steps per rollout batch, each with its own plan entry.
        needs_rollout_reference: the rollout must score its canvases with the reference model.
    """

    name: str
    score: ScoreStep
    advantages: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    loss: LossFn
    sample_plan: Callable[[RolloutBatch, torch.Generator], Any] | None = None
    prepare: Callable[[Experience, torch.Generator], None] | None = None
    update: UpdateFn | None = None
    sampling_overrides: Mapping[str, Any] = field(default_factory=dict)
    rollout: RolloutFn | None = None
    needs_reference: bool = False
    needs_old: bool = True
    num_iterations: int = 1
    needs_rollout_reference: bool = False

    def __post_init__(self) -> None:
        if self.num_iterations < 1:
            raise ValueError(f"{self.name}: num_iterations must be >= 1, got {self.num_iterations}")


def at_iteration(values: torch.Tensor | None, exp: Experience, num_iterations: int) -> torch.Tensor | None:
    """The entry of a per-iteration stack for `exp.iteration` (the tensor itself if one iteration)."""
    if values is None or num_iterations == 1:
        return values
    return values[exp.iteration]


def default_update(objective: PolicyObjective, scorer: Scorer, exp: Experience) -> tuple[torch.Tensor, Metrics]:
    """One forward of `score`, the loss, one backward.

    The backward runs even when the loss is not finite (the actor then skips the step): on ranks
    in lockstep (`Scorer.lockstep_group`) the backward is a collective that every rank must join.
    """
    values = objective.score(scorer, exp)
    if exp.old_logp is None and exp.extras.get("old_from_training_pass"):
        exp.old_logp = values.detach()  # the policy has not moved since the rollout (ActorWorker.reuse_old)
    old = at_iteration(exp.old_logp, exp, objective.num_iterations)
    loss, metrics = objective.loss(values, old, exp.advantages, exp)
    torch.autograd.backward(loss)
    return loss.detach(), metrics
