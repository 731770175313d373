"""d1 with Dr.GRPO advantages, as a user's own package adds an RL algorithm to DARE.

Dr.GRPO (Liu et al., arXiv 2503.20783) drops GRPO's division by the group's standard deviation:
A_i = r_i - mean_g(r). Everything else is d1's (one-step mean-field log-probs, the clipped
surrogate), so the algorithm is a subclass that overrides `advantages`; a new loss would override
`prepare` / `values` / `loss` the same way (see `dllm_train.RLAlgorithm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dare.algorithms import Default, RLEntry
from dllm_algorithms import D1
from dllm_objectives import group_mean


@dataclass(frozen=True, kw_only=True)
class DrD1(D1):
    """d1 with Dr.GRPO advantages (Liu et al., arXiv 2503.20783): reward minus the group mean, no std."""

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        mean, _ = group_mean(scores, group_ids)
        return scores - mean


ENTRY = RLEntry(
    name="dr-d1",
    algorithm=DrD1(),
    paper="Liu et al., arXiv 2503.20783",
    defaults=(
        # every recipe value says where it comes from: a line of the original code, or a reason
        Default(key="rl.group_size", value=8, reason="d1's group size; Dr.GRPO's paper does not change it"),
        Default(key="rollout.temperature", value=0.6, families=("llada",),
                reason="LLaDA's training temperature in DARE's d1 script"),
    ),
)
