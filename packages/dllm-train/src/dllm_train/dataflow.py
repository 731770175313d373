"""Dataflow: the typed batches that move between workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_rollout import RolloutBatch


@dataclass(frozen=True)
class PromptBatch:
    """Prompts handed to the rollout worker.

    Attributes:
        prompts: token-id lists, one per distinct prompt.
        answers: ground truth per prompt, for the reward worker.
        group_size: samples per prompt.
    """

    prompts: list[list[int]]
    answers: list[str]
    group_size: int

    def expanded(self) -> tuple[list[list[int]], list[str], torch.Tensor]:
        """Prompt-major expansion: each prompt repeated group_size times, with group ids [B]."""
        g = self.group_size
        prompts = [p for p in self.prompts for _ in range(g)]
        answers = [a for a in self.answers for _ in range(g)]
        groups = torch.arange(len(self.prompts)).repeat_interleave(g)
        return prompts, answers, groups


@dataclass
class Experience:
    """A rollout batch with everything the update needs.

    Attributes:
        rollout: prompts, responses and masks (and trajectory records when requested).
        scores: [B] rewards.
        group_ids: [B] prompt index of each sample.
        advantages: [B] (or [B, R]) advantages.
        plan: what the objective's `sample_plan` drew (a MaskPlan, a tuple of plans, or one
            entry per update iteration), shared by the old, reference and current passes.
        old_logp: the objective's values under the policy that generated the batch
            ([I, ...] stacked over update iterations when the objective has several).
        ref_logp: the same values under the reference model, if a reference worker exists.
        texts: decoded responses, for logging.
        extras: objective-specific tensors derived in `prepare` (training rows, step
            advantages, tree segments, importance weights...).
        iteration: index of the update iteration being run (multi-iteration objectives).
    """

    rollout: RolloutBatch
    scores: torch.Tensor
    group_ids: torch.Tensor
    advantages: torch.Tensor | None = None
    plan: Any = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    texts: list[str] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)
    iteration: int = 0
