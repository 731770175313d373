"""Dataflow: the typed batches that move between workers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dllm_objectives import MaskPlan
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
        rollout: prompts, responses and masks.
        scores: [B] rewards.
        group_ids: [B] prompt index of each sample.
        advantages: [B] (or [B, R]) advantages.
        plan: the mask plan shared by old, reference and current passes.
        old_logp: [B, R] token log-probs of the policy that generated the batch.
        ref_logp: [B, R] reference-model token log-probs, if a reference worker exists.
        texts: decoded responses, for logging.
    """

    rollout: RolloutBatch
    scores: torch.Tensor
    group_ids: torch.Tensor
    advantages: torch.Tensor | None = None
    plan: MaskPlan | None = None
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    texts: list[str] = field(default_factory=list)
