"""The one rollout batch type every sampler and engine returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RolloutBatch:
    """Prompts and generated responses, with optional trajectory records.

    Attributes:
        prompt_ids: [B, P] left-padded prompt ids.
        prompt_mask: [B, P] bool, True on real prompt tokens.
        response_ids: [B, R] generated tokens (prompt excluded).
        response_mask: [B, R] bool, True on response tokens that count (see `eos_handling`).
        seeds: [B] per-sample seeds; `generate(..., seed=seeds[i:i+1])` on prompt i replays it.
        unmask_step: [B, R] long, global denoising step at which each response token was
            committed (-1 if never), present when trajectories are recorded.
        step_logp: [B, R] float32 log-prob of each committed token under the sampling
            distribution at the step it was committed, present when trajectories are recorded.
        extras: further engine- or algorithm-agnostic per-sample tensors.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    seeds: torch.Tensor
    unmask_step: torch.Tensor | None = None
    step_logp: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        b = self.prompt_ids.shape[0]
        for name in ("prompt_mask", "response_ids", "response_mask", "seeds"):
            if getattr(self, name).shape[0] != b:
                raise ValueError(f"RolloutBatch.{name} has batch {getattr(self, name).shape[0]}, expected {b}")

    @property
    def batch_size(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def input_ids(self) -> torch.Tensor:
        """[B, P + R] prompt followed by response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, P + R] bool: real prompt tokens and counted response tokens."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def select(self, index: torch.Tensor) -> RolloutBatch:
        """The rows at `index` (a long or bool tensor over the batch)."""
        return RolloutBatch(
            prompt_ids=self.prompt_ids[index],
            prompt_mask=self.prompt_mask[index],
            response_ids=self.response_ids[index],
            response_mask=self.response_mask[index],
            seeds=self.seeds[index],
            unmask_step=None if self.unmask_step is None else self.unmask_step[index],
            step_logp=None if self.step_logp is None else self.step_logp[index],
            extras={k: v[index] for k, v in self.extras.items()},
        )
