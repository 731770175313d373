"""How an algorithm reads its batch and scores it: sequence inputs, response slices, plan copies,
plan log-probs and metric means."""

from __future__ import annotations

import torch

from dllm_objectives import MaskPlan
from dllm_rollout import RolloutBatch
from dllm_train import RLBatch, ValuesScorer, plan_token_logp, sequence_inputs

Metrics = dict[str, torch.Tensor]


def inputs(batch: RLBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, prompt_valid, response_valid) of the batch, [B, P + R]."""
    return sequence_inputs(batch.rollout)


def response_part(values: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
    """[..., P + R] -> [..., R]."""
    return values[..., rollout.prompt_ids.shape[1]:]


def is_block(rollout: RolloutBatch) -> bool:
    """Whether the rollout came from a block-diffusion model."""
    return rollout.config is not None and rollout.config.block_diffusion


def slice_plan(plan: MaskPlan, start: int, stop: int) -> MaskPlan:
    """Copies [start, stop) of a plan (per-copy meta tensors are sliced too)."""
    meta = {k: (v[:, start:stop] if v.dim() >= 2 and v.shape[1] == plan.num_samples else v)
            for k, v in plan.meta.items()}
    return MaskPlan(mask=plan.mask[:, start:stop], p_mask=plan.p_mask[:, start:stop], meta=meta)


def plan_logp(scorer: ValuesScorer, batch: RLBatch, plan: MaskPlan, *, temperature: float = 1.0) -> torch.Tensor:
    """[B, N, P + R] log-probs of the clean sequence under every copy of `plan` (one scorer call)."""
    ids, attn, _, _ = inputs(batch)
    return plan_token_logp(scorer, ids, attn, plan, temperature=temperature)


def mean_metrics(parts: list[Metrics]) -> Metrics:
    """Element-wise mean of metric dicts with the same keys (detached)."""
    return {k: torch.stack([p[k].detach().float() for p in parts]).mean() for k in parts[0]} if parts else {}


__all__ = ["Metrics", "inputs", "is_block", "mean_metrics", "plan_logp", "response_part", "slice_plan"]
