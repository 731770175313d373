"""Pieces shared by the algorithm modules: batch views, advantages and plan slicing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dllm_objectives import MaskPlan, grpo_advantages
from dllm_rollout import RolloutBatch
from dllm_train import Experience, PolicyObjective, RLConfig, Scorer, plan_token_logp, sequence_inputs

MASKED = ("llada", "dream")
BLOCK = ("sdar", "sdar_moe", "llada2")
ALL_FAMILIES = MASKED + BLOCK


class Algorithm(Protocol):
    """A registry entry: a frozen dataclass of hyper-parameters that builds its objective."""

    @property
    def families(self) -> tuple[str, ...]: ...

    def build(self, rl: RLConfig) -> PolicyObjective: ...


@dataclass(frozen=True)
class Clip:
    """Clipped-surrogate constants taken from the run's RLConfig."""

    low: float
    high: float
    dual: float | None

    @classmethod
    def of(cls, rl: RLConfig) -> Clip:
        return cls(rl.clip_low, rl.clip_high, rl.dual_clip)


def inputs(exp: Experience) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, prompt_valid, response_valid) of the experience, [B, P + R]."""
    return sequence_inputs(exp.rollout)


def response_part(values: torch.Tensor, rollout: RolloutBatch) -> torch.Tensor:
    """[..., P + R] -> [..., R]."""
    return values[..., rollout.prompt_ids.shape[1]:]


def is_block(rollout: RolloutBatch) -> bool:
    """Whether the rollout came from a block-diffusion model."""
    return rollout.config is not None and rollout.config.block_diffusion


def grpo(scores: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    return grpo_advantages(scores, groups)


def current_plan(exp: Experience, num_iterations: int) -> Any:
    """This iteration's entry of the plan (the plan itself with one iteration)."""
    return exp.plan[exp.iteration] if num_iterations > 1 else exp.plan


def slice_plan(plan: MaskPlan, start: int, stop: int) -> MaskPlan:
    """Copies [start, stop) of a plan (per-copy meta tensors are sliced too)."""
    meta = {k: (v[:, start:stop] if v.dim() >= 2 and v.shape[1] == plan.num_samples else v)
            for k, v in plan.meta.items()}
    return MaskPlan(mask=plan.mask[:, start:stop], p_mask=plan.p_mask[:, start:stop], meta=meta)


def plan_logp(scorer: Scorer, exp: Experience, plan: MaskPlan, *, temperature: float = 1.0) -> torch.Tensor:
    """[B, N, P + R] log-probs of the clean sequence under every copy of `plan`."""
    ids, attn, _, _ = inputs(exp)
    return plan_token_logp(scorer, ids, attn, plan, temperature=temperature)


def first_doc_line(obj: Any) -> str:
    return (type(obj).__doc__ or "").strip().splitlines()[0]
