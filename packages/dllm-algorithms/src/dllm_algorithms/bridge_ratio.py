"""BridgeRatio-GRPO: a sequence ratio estimated from the shared coupled denoising paths.

The paths are Coupled-GRPO's three noisy copies (whole response masked, and two complementary
halves); each path's score is its ELBO estimate, and the policy ratio is the ratio of the two
log-mean-exp path likelihoods (`dllm_objectives.bridge_log_ratio`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import BRIDGE_CORRECTIONS, MaskPlan, bridge_ratio_policy_loss, coupled_masks, elbo
from dllm_train import LossInputs, RLAlgorithm, RLBatch, ValuesScorer

from dllm_algorithms.clipping import DualClip
from dllm_algorithms.families import MASKED
from dllm_algorithms.scoring import Metrics, inputs, plan_logp

SCORE_SCALES = ("token", "sequence", "valid_tokens")
"""Scales of the path scores: ELBO / R (padded response length), raw ELBO, ELBO x L / R."""


@dataclass(frozen=True, kw_only=True)
class BridgeRatioGRPO(DualClip, RLAlgorithm[MaskPlan]):
    """BridgeRatio-GRPO (CURE-RLVR; DARE PR #21): a policy ratio over shared denoising paths.

    Per row t ~ U[t_min, t_max]; paths: the whole response masked, and two complementary halves
    (Coupled-GRPO's copies); path score l_k = ELBO_k (1/pi weights) on the `score_scale`;
    log r = logsumexp_k l_k - logsumexp_k l_old_k on the same paths, with an optional bias
    `correction`; PPO clipped surrogate with dual clip, broadcast over the response, token-mean.
    The paths meet inside the logsumexp, so the loss is not row-local.

    Attributes:
        t_min, t_max: range of the per-row masking ratio t of the complementary pair.
        correction: bias correction of the log ratio: "none", "delta", "jackknife" or "cumulant".
        detach_correction: no gradient through the "delta" term and the "cumulant" weights.
        score_scale: "token" (ELBO / R, R the padded response length, DARE's default),
            "sequence" (raw ELBO) or "valid_tokens" (ELBO x L / R, L the valid length).
        log_ratio_clip: clamp of log r before the exponential (None: off).
    """

    t_min: float = 0.2
    t_max: float = 0.8
    correction: str = "none"
    detach_correction: bool = True
    score_scale: str = "token"
    log_ratio_clip: float | None = None
    families: ClassVar[tuple[str, ...]] = MASKED

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.correction not in BRIDGE_CORRECTIONS:
            raise ValueError(f"algorithm.correction={self.correction!r} is unknown; choose one of "
                             f"{list(BRIDGE_CORRECTIONS)}")
        if self.score_scale not in SCORE_SCALES:
            raise ValueError(f"algorithm.score_scale={self.score_scale!r} is unknown; choose one of {list(SCORE_SCALES)}")
        if self.log_ratio_clip is not None and self.log_ratio_clip <= 0:
            raise ValueError(f"algorithm.log_ratio_clip must be > 0 or unset (off), got {self.log_ratio_clip}")
        if not 0.0 < self.t_min <= self.t_max < 1.0:
            raise ValueError(f"algorithm.t_min, t_max must satisfy 0 < t_min <= t_max < 1, got {self.t_min}, {self.t_max}")

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> MaskPlan:
        return coupled_masks(inputs(batch)[3], t_min=self.t_min, t_max=self.t_max, include_full=True,
                             generator=generator)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: MaskPlan, iteration: int) -> torch.Tensor:
        """[B, 3] path scores."""
        raw = elbo(plan_logp(scorer, batch, data), data)
        rollout = batch.rollout
        width = float(rollout.response_ids.shape[1])
        if self.score_scale == "sequence":
            return raw
        if self.score_scale == "valid_tokens":
            return raw * (rollout.response_mask.sum(-1, keepdim=True).clamp(min=1).to(raw.dtype) / width)
        return raw / width

    def loss(self, values: torch.Tensor, inputs: LossInputs[MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        assert inputs.old is not None
        return bridge_ratio_policy_loss(values, inputs.old, inputs.advantages, inputs.batch.rollout.response_mask,
                                        clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip,
                                        correction=self.correction, detach_correction=self.detach_correction,
                                        log_ratio_clip=self.log_ratio_clip)


__all__ = ["SCORE_SCALES", "BridgeRatioGRPO"]
