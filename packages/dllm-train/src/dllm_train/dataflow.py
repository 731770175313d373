"""Dataflow: the prompts handed to a step (the typed batches after the rollout are in `algorithm`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch



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
