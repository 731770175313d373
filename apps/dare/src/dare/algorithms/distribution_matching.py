"""Distribution matching: fit the reward-tilted reference distribution by weighted denoising.

DMPO (Zhu et al., arXiv 2510.08233): target p* ∝ p_ref e^{r / alpha}; self-normalised
importance weights from the log Radon-Nikodym derivative log p_ref - log p_theta of each
rollout (read off the rollout's per-step log-probs under both models) and the rewards;
weight-baseline subtraction; weighted masked cross-entropy (WDCE) on antithetic iid masks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_objectives import MaskPlan, dmpo_baseline, dmpo_ess_coeff, dmpo_weights, iid_masks, wdce_loss
from dllm_rollout import RolloutBatch
from dllm_train import Experience, PolicyObjective, RLConfig, Scorer, sequence_inputs

from dare.algorithms.common import MASKED, current_plan, grpo, plan_logp

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class DMPO:
    """DMPO (arXiv 2510.08233): importance-weighted denoising cross-entropy (WDCE).

    Defaults of the current public code: alpha 0.04, 4 antithetic replicates with mask ratio in
    [0.1, 1), individual baseline; `ess_target` > 0 picks the weight temperature by ESS.
    `num_iterations` optimizer steps per rollout batch (mu; the public config uses 8), each on
    fresh masks; the weights stay those of the rollout (spec §2.12): no ratio, no clipping.
    """

    alpha: float = 0.04
    num_replicates: int = 4
    baseline: str = "individual"
    coeff: float = 1.0
    ess_target: float = 0.0
    num_iterations: int = 1
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        if self.num_replicates % 2:
            raise ValueError(f"dmpo.num_replicates must be even (antithetic pairs), got {self.num_replicates}")

        def prepare(exp: Experience, gen: torch.Generator) -> None:
            r = exp.rollout
            if r.step_logp is None or r.ref_step_logp is None:
                raise ValueError("dmpo needs rollout step log-probs under the policy and the reference: "
                                 "RolloutWorker(..., ref_model=...) with record_trajectory")
            keep = r.response_mask
            log_rnd = ((r.ref_step_logp - r.step_logp) * keep).sum(-1)
            coeff = (dmpo_ess_coeff(log_rnd, exp.scores, alpha=self.alpha, ess_target=self.ess_target)
                     if self.ess_target > 0 else self.coeff)
            w, w_neg = dmpo_weights(exp.scores, log_rnd, exp.group_ids, alpha=self.alpha, coeff=coeff)
            exp.extras["dmpo_weights"] = dmpo_baseline(w, exp.group_ids, kind=self.baseline, neg_weights=w_neg)

        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            return iid_masks(sequence_inputs(rollout)[3], self.num_replicates, t_min=0.1, t_max=1.0,
                             antithetic=True, generator=gen)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            return plan_logp(scorer, exp, current_plan(exp, self.num_iterations))

        def loss(value: torch.Tensor, old: torch.Tensor | None, adv: torch.Tensor, exp: Experience) -> tuple[torch.Tensor, Metrics]:
            w = exp.extras["dmpo_weights"]
            mask = current_plan(exp, self.num_iterations).mask
            return wdce_loss(value, mask, w), {"weight_abs_mean": w.abs().mean()}

        return PolicyObjective(name="dmpo", score=score, advantages=grpo, loss=loss, prepare=prepare,
                               sample_plan=plan, needs_old=False, needs_rollout_reference=True,
                               num_iterations=self.num_iterations, sampling_overrides={"record_trajectory": True})
