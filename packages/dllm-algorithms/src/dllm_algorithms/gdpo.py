"""GDPO (Rojas et al., arXiv 2510.08554): a clipped ratio of sequence ELBOs estimated by quadrature
over the noise level (semi-deterministic Monte Carlo, `dllm_objectives.sdmc_masks`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import MaskPlan, gdpo_loss, grpo_advantages, quadrature_elbo, quadrature_rule, sdmc_masks
from dllm_train import LossInputs, RLAlgorithm, RLBatch, ValuesScorer

from dllm_algorithms.clipping import RatioClip
from dllm_algorithms.families import MASKED
from dllm_algorithms.scoring import Metrics, inputs, plan_logp


@dataclass(frozen=True, kw_only=True)
class GDPO(RatioClip, RLAlgorithm[list[MaskPlan]]):
    """GDPO (Rojas et al., arXiv 2510.08554): sequence ELBOs by quadrature over t, a clipped sequence ratio.

    Per iteration fresh masks: at each node t_k of the rule, `mc_samples` sets of floor(t_k L) response
    positions; E = sum_k w_k / t_k sum_masked log p (raw); ratio exp((E - E_old) / R) with R the padded
    response width, clipped; advantages r - group mean (no std); k3 KL on raw ELBOs when `kl_coef` > 0.
    Defaults are the authors' scripts' (docs/algorithms.md#gdpo).

    Attributes:
        rule: quadrature rule over the noise level ("gauss-N" or "simpson").
        mc_samples: mask draws per node.
        num_iterations: optimizer steps per rollout batch, each on fresh masks.
        kl_coef: weight of the k3 KL to the frozen reference (0: no reference model).
    """

    rule: str = "gauss-3"
    mc_samples: int = 1
    num_iterations: int = 12
    kl_coef: float = 0.0
    families: ClassVar[tuple[str, ...]] = MASKED
    record_fields: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            quadrature_rule(self.rule)
        except ValueError as exc:
            raise ValueError(f"algorithm.rule: {exc}") from None
        if self.mc_samples < 1:
            raise ValueError(f"algorithm.mc_samples must be >= 1, got {self.mc_samples}; the authors use 1")
        if self.num_iterations < 1:
            raise ValueError(f"algorithm.num_iterations must be >= 1, got {self.num_iterations}")
        if not self.kl_coef >= 0:
            raise ValueError(f"algorithm.kl_coef must be >= 0 (0: no reference model), got {self.kl_coef}")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return grpo_advantages(scores, group_ids, norm_by_std=False)

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> list[MaskPlan]:
        valid = inputs(batch)[3]
        return [sdmc_masks(valid, rule=self.rule, mc_samples=self.mc_samples, generator=generator)
                for _ in range(self.num_iterations)]

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: list[MaskPlan], iteration: int) -> torch.Tensor:
        plan = data[iteration]
        return quadrature_elbo(plan_logp(scorer, batch, plan), plan)

    def loss(self, values: torch.Tensor, inputs: LossInputs[list[MaskPlan]]) -> tuple[torch.Tensor, Metrics]:
        assert inputs.old is not None
        width = float(inputs.batch.rollout.response_ids.shape[1])  # the authors' completion_ids.shape[-1]
        return gdpo_loss(values, inputs.old, inputs.advantages, length=width, clip_low=self.clip_low,
                         clip_high=self.clip_high, ref_elbo=inputs.ref, kl_coef=self.kl_coef)


__all__ = ["GDPO"]
