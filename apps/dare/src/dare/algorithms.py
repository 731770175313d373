"""Algorithms as data: one plain dict from name to a builder of its PolicyObjective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dllm_objectives import MaskPlan, clipped_policy_loss, grpo_advantages, one_step_masks
from dllm_rollout import RolloutBatch
from dllm_train import PolicyObjective, RLConfig, sequence_inputs


def _response_slice(token_logp: torch.Tensor, plan: MaskPlan, rollout: RolloutBatch) -> torch.Tensor:
    """The single copy's response positions: [B, 1, P + R] -> [B, R]."""
    return token_logp[:, 0, rollout.prompt_ids.shape[1]:]


def d1(rl: RLConfig) -> PolicyObjective:
    """d1 / diffu-GRPO (Zhao et al., arXiv 2504.12216): one-step mean-field log-probs.

    The whole response is masked and 15% of the prompt; one forward gives every response token's
    log-prob; GRPO advantages; PPO clipped surrogate with dual clip; token-mean aggregation.
    """

    def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
        _, _, prompt_valid, response_valid = sequence_inputs(rollout)
        return one_step_masks(prompt_valid, response_valid, prompt_mask_prob=0.15, generator=gen)

    def loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
             ref_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return clipped_policy_loss(logp, old_logp, adv, mask, clip_low=rl.clip_low,
                                   clip_high=rl.clip_high, dual_clip=rl.dual_clip)

    return PolicyObjective(
        name="d1",
        sample_plan=plan,
        reduce=_response_slice,
        advantages=lambda scores, groups: grpo_advantages(scores, groups),
        loss=loss,
    )


ALGORITHMS: dict[str, Callable[[RLConfig], PolicyObjective]] = {
    "d1": d1,
}


def build_objective(name: str, rl: RLConfig) -> PolicyObjective:
    """The PolicyObjective of algorithm `name`."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is unknown; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name](rl)


def describe() -> dict[str, Any]:
    return {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in ALGORITHMS.items()}
