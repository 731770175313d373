"""Token-level policy gradients with one-step or exact per-token likelihoods.

d1 (mean-field one-step log-probs), Coupled-GRPO (complementary masks) and JustGRPO (exact
autoregressive-order log-probs): each token's log-prob enters the PPO clipped surrogate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import (
    MaskPlan,
    autoregressive_steps,
    clipped_policy_loss,
    coupled_masks,
    coupled_token_logp,
    one_step_masks,
    replay_plan,
)
from dllm_train import LossInputs, RLAlgorithm, RLBatch, ValuesScorer

from dllm_algorithms.clipping import DualClip
from dllm_algorithms.families import MASKED
from dllm_algorithms.scoring import Metrics, inputs, plan_logp, response_part, slice_plan


def _clipped(values: torch.Tensor, x: LossInputs[MaskPlan], clip_low: float, clip_high: float,
             dual_clip: float | None) -> tuple[torch.Tensor, Metrics]:
    assert x.old is not None
    return clipped_policy_loss(values, x.old, x.advantages[:, None], x.batch.rollout.response_mask,
                               clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)


@dataclass(frozen=True, kw_only=True)
class D1(DualClip, RLAlgorithm[MaskPlan]):
    """d1 / diffu-GRPO (Zhao et al., arXiv 2504.12216): one-step mean-field token log-probs.

    The whole response and a random 15% of the prompt are masked; one forward gives every
    response token's log-prob; GRPO advantages; PPO clipped surrogate with dual clip.

    Attributes:
        prompt_mask_prob: fraction of the prompt tokens masked at random in the scored copy.
    """

    prompt_mask_prob: float = 0.15
    families: ClassVar[tuple[str, ...]] = MASKED
    row_local = True

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> MaskPlan:
        _, _, prompt_valid, response_valid = inputs(batch)
        return one_step_masks(prompt_valid, response_valid, prompt_mask_prob=self.prompt_mask_prob,
                              generator=generator)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: MaskPlan, iteration: int) -> torch.Tensor:
        return response_part(plan_logp(scorer, batch, data)[:, 0], batch.rollout)

    def loss(self, values: torch.Tensor, inputs: LossInputs[MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        return _clipped(values, inputs, self.clip_low, self.clip_high, self.dual_clip)


@dataclass(frozen=True, kw_only=True)
class CoupledGRPO(DualClip, RLAlgorithm[MaskPlan]):
    """Coupled-GRPO (DiffuCoder, arXiv 2506.20639): complementary-mask token scores.

    Per row t ~ U[t_min, t_max]; copies: whole response masked, and two complementary halves;
    score 0.5 (l_full + l_a / t + l_b / (1 - t)) in the clipped surrogate. The three copies of a
    token meet inside the ratio, so the loss is not row-local.

    Attributes:
        t_min, t_max: range of the per-row masking ratio t of the complementary pair.
        fixed_mask_seed: None (default): fresh masks per row and step from the run's seeded
            stream. An integer (DARE uses 42) reproduces DARE's masks: it calls `set_seed(42)`
            before every row's draw, so every row of every step shares one t (Python's
            `random.uniform`) and one u vector (CPU `torch.rand`); see docs/algorithms.md.
    """

    t_min: float = 0.2
    t_max: float = 0.8
    fixed_mask_seed: int | None = None
    families: ClassVar[tuple[str, ...]] = MASKED

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> MaskPlan:
        return coupled_masks(inputs(batch)[3], t_min=self.t_min, t_max=self.t_max, include_full=True,
                             fixed_seed=self.fixed_mask_seed, generator=generator)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: MaskPlan, iteration: int) -> torch.Tensor:
        lp = plan_logp(scorer, batch, data)
        return response_part(coupled_token_logp(lp[:, 0], lp[:, 1:], slice_plan(data, 1, 3)), batch.rollout)

    def loss(self, values: torch.Tensor, inputs: LossInputs[MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        return _clipped(values, inputs, self.clip_low, self.clip_high, self.dual_clip)


@dataclass(frozen=True, kw_only=True)
class JustGRPO(DualClip, RLAlgorithm[MaskPlan]):
    """JustGRPO (Ni et al., arXiv 2601.15165): exact left-to-right log-probs of a dLLM.

    State j = prompt + o_<j with o_>=j masked; log softmax(f / T)[o_j] with the rollout
    temperature T; every state is one scored row (the trainer's token budget decides how many
    run per forward). The rollout should decode left to right (block length 1, steps = response
    length).

    Attributes:
        temperature: T of the scored log softmax(f / T). None (the default): the temperature the
            rollout sampled at (its `SamplingConfig`; 1 for greedy rollouts), which makes the
            scored policy the sampling policy.
    """

    temperature: float | None = None
    families: ClassVar[tuple[str, ...]] = MASKED
    row_local = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"algorithm.temperature must be > 0 (or unset: the rollout's), got {self.temperature}")

    def scoring_temperature(self, batch: RLBatch) -> float:
        """`temperature`, or the rollout's sampling temperature (1 where it decoded greedily)."""
        if self.temperature is not None:
            return self.temperature
        cfg = batch.rollout.config
        if cfg is None:
            raise ValueError("JustGRPO scores at the rollout's temperature, but this rollout batch carries no "
                             "SamplingConfig (an engine's output?): set algorithm.temperature")
        return cfg.temperature if cfg.temperature > 0 else 1.0

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> MaskPlan:
        return replay_plan(autoregressive_steps(inputs(batch)[3]))

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: MaskPlan, iteration: int) -> torch.Tensor:
        lp = plan_logp(scorer, batch, data, temperature=self.scoring_temperature(batch))
        return response_part((lp * data.meta["scored"].to(lp.dtype)).sum(1), batch.rollout)

    def loss(self, values: torch.Tensor, inputs: LossInputs[MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        assert inputs.old is not None
        valid = inputs.batch.rollout.response_mask
        total = float(valid.sum().clamp(min=1))
        return clipped_policy_loss(values, inputs.old, inputs.advantages[:, None], valid, clip_low=self.clip_low,
                                   clip_high=self.clip_high, dual_clip=self.dual_clip,
                                   agg="seq-mean-token-sum-norm", norm_const=total)


__all__ = ["CoupledGRPO", "D1", "JustGRPO"]
