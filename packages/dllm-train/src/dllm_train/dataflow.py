"""Dataflow: the prompts handed to a step (the typed batches after the rollout are in `algorithm`),
and `map_tensors`, which moves or slices every tensor of such a batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
