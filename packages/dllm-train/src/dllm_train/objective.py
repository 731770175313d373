"""A policy objective as data: how an RL algorithm turns a rollout into a loss.

The trainer only composes these callables; it never branches on an algorithm's name. Concrete
algorithms are instances of `PolicyObjective` built from dllm_objectives functions by the app.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_objectives import MaskPlan
from dllm_rollout import RolloutBatch

PlanFn = Callable[[RolloutBatch, torch.Generator], MaskPlan]
"""Samples the mask plan shared by old, reference and current passes."""
ReduceFn = Callable[[torch.Tensor, MaskPlan, RolloutBatch], torch.Tensor]
"""Turns copy log-probs [B, N, P + R] into the per-token response log-probs [B, R] the loss uses."""
AdvantageFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(scores [B], group_ids [B]) -> advantages [B] or [B, R]."""
LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""(logp, old_logp, advantages, mask, ref_logp=...) -> (loss, metrics)."""


@dataclass(frozen=True)
class PolicyObjective:
    """Everything an RL algorithm contributes to a step.

    Attributes:
        name: display name.
        sample_plan: mask-plan sampler.
        reduce: copy log-probs -> response token log-probs.
        advantages: advantage estimator.
        loss: loss over response tokens.
        needs_reference: whether a reference model pass is required.
        sampling_overrides: SamplingConfig fields the algorithm needs (e.g. trajectories).
    """

    name: str
    sample_plan: PlanFn
    reduce: ReduceFn
    advantages: AdvantageFn
    loss: LossFn
    needs_reference: bool = False
    sampling_overrides: dict[str, Any] = field(default_factory=dict)
