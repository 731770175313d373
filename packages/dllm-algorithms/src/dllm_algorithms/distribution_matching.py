"""Distribution matching: fit the reward-tilted reference distribution by weighted denoising.

DMPO (Zhu et al., arXiv 2510.08233): target p* ∝ p_ref e^{r / alpha}; self-normalised
importance weights from the log Radon-Nikodym derivative log p_ref - log p_theta of each
rollout (read off the rollout's per-step log-probs under both models) and the rewards;
weight-baseline subtraction; weighted masked cross-entropy (WDCE) on antithetic iid masks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import MaskPlan, dmpo_baseline, dmpo_ess_coeff, dmpo_weights, iid_masks, wdce_loss
from dllm_train import LossInputs, RLAlgorithm, RLBatch, ValuesScorer

from dllm_algorithms.families import MASKED
from dllm_algorithms.scoring import Metrics, inputs, plan_logp


@dataclass(frozen=True)
class WeightedMasks:
    """DMPO's per-batch data: the importance weights [B] and the masks of every iteration."""

    weights: torch.Tensor
    plans: list[MaskPlan]


@dataclass(frozen=True, kw_only=True)
class DMPO(RLAlgorithm[WeightedMasks]):
    """DMPO (arXiv 2510.08233): importance-weighted denoising cross-entropy (WDCE).

    Defaults of the current public code: alpha 0.04, 4 antithetic replicates with mask ratio in
    [0.1, 1), individual baseline, 8 inner iterations; `ess_target` > 0 picks the weight
    temperature by ESS. `num_iterations` optimizer steps per rollout batch (mu), each on fresh
    masks; the weights stay those of the rollout: no ratio, no clipping.

    Attributes:
        alpha: reward temperature of the importance weights (0: softmax of the rewards; -1: raw rewards).
        mc_num: antithetic masks per sequence (even), mask ratio in [0.1, 1).
        baseline: weight baseline: "individual" (w - w-), "group", "model" or "none".
        coeff: kappa in [0, 1] scaling the weights' logits (ignored when ess_target > 0).
        ess_target: > 0: kappa chosen so the weights' effective sample size meets this target.
        num_iterations: optimizer steps per rollout batch (each on fresh masks).
    """

    alpha: float = 0.04
    mc_num: int = 4
    baseline: str = "individual"
    coeff: float = 1.0
    ess_target: float = 0.0
    num_iterations: int = 8
    families: ClassVar[tuple[str, ...]] = MASKED
    needs_old = False
    row_local = True
    record_fields = frozenset({"step_logp", "ref_step_logp"})

    def __post_init__(self) -> None:
        if self.mc_num % 2:
            raise ValueError(f"algorithm.mc_num must be even (antithetic pairs), got {self.mc_num}")
        if self.num_iterations < 1:
            raise ValueError(f"algorithm.num_iterations must be >= 1, got {self.num_iterations}")

    @property
    def needs_distinct_samples(self) -> bool:
        """Identical samples of a group get equal self-normalised weights, which the group,
        individual and model baselines cancel (`dmpo_baseline`); raw rewards (alpha=-1) survive
        the individual and model baselines, and no baseline keeps every weight."""
        return self.baseline == "group" or (self.alpha != -1 and self.baseline in ("individual", "model"))

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> WeightedMasks:
        r = batch.rollout
        if r.step_logp is None or r.ref_step_logp is None:
            raise ValueError("DMPO needs rollout step log-probs under the policy and the reference: "
                             "RolloutWorker(..., ref_model=...) with record_trajectory")
        log_rnd = ((r.ref_step_logp - r.step_logp) * r.response_mask).sum(-1)
        scores, groups = batch.scores.to(log_rnd.device), batch.group_ids.to(log_rnd.device)
        coeff = (dmpo_ess_coeff(log_rnd, scores, alpha=self.alpha, ess_target=self.ess_target)
                 if self.ess_target > 0 else self.coeff)
        w, w_neg = dmpo_weights(scores, log_rnd, groups, alpha=self.alpha, coeff=coeff)
        weights = dmpo_baseline(w, groups, kind=self.baseline, neg_weights=w_neg)
        plans = [iid_masks(inputs(batch)[3], self.mc_num, t_min=0.1, t_max=1.0, antithetic=True,
                           generator=generator) for _ in range(self.num_iterations)]
        return WeightedMasks(weights=weights, plans=plans)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: WeightedMasks, iteration: int) -> torch.Tensor:
        return plan_logp(scorer, batch, data.plans[iteration])

    def loss(self, values: torch.Tensor, inputs: LossInputs[WeightedMasks]) -> tuple[torch.Tensor, Metrics]:
        w = inputs.data.weights
        return wdce_loss(values, inputs.data.plans[inputs.iteration].mask, w), {"weight_abs_mean": w.abs().mean()}


__all__ = ["DMPO", "WeightedMasks"]
