"""Sequence-level policy gradients on Monte-Carlo ELBOs of whole responses.

BGPO (linear lower bound per MC sample), ESPO (antithetic ELBO ratio), EBPO (composite block
ELBO of block-diffusion models) and SPG (ELBO / EUBO sandwich). The memory-saving backward
strategies of the papers (one backward per MC sample, proxy backward) are the trainer's token
budget (`dllm_train.passes`), with the same gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_objectives import (
    MaskPlan,
    antithetic_elbo,
    bgpo_policy_loss,
    block_count_masks,
    block_ids,
    composite_block_elbo,
    count_masks,
    elbo,
    espo_masks,
    rloo_advantages,
    sequence_clip_loss,
    sequence_kl,
    spg_block_masks,
    spg_loss,
    spg_sequence_logp,
)
from dllm_rollout import RolloutBatch
from dllm_train import LossInputs, RLAlgorithm, RLBatch, ValuesScorer

from dllm_algorithms.clipping import DualClip, RatioClip
from dllm_algorithms.families import ALL_FAMILIES, BLOCK, MASKED
from dllm_algorithms.scoring import Metrics, inputs, is_block, mean_metrics, plan_logp


def _elbo_normalizer(rollout: RolloutBatch) -> float | torch.Tensor:
    """Masked families: ÷ padded response length R; block families: ÷ valid length L_i."""
    if is_block(rollout):
        return rollout.response_mask.sum(-1).clamp(min=1)
    return float(rollout.response_ids.shape[1])


def _sequence_loss(value: torch.Tensor, x: LossInputs[Any], *, clip_low: float, clip_high: float,
                   kl_coef: float, kl_kind: str, length: float,
                   valid: torch.Tensor | None = None, k1_grad_correction: bool = False) -> tuple[torch.Tensor, Metrics]:
    """Clipped sequence ratio plus `kl_coef` times the sequence KL to the reference (on value x length).

    `valid` ([B] bool): average both terms over these sequences only (None: all).
    `k1_grad_correction`: ESPO's k1 gradient (1 + Delta) grad E (`sequence_kl`).
    """
    assert x.old is not None
    pg, metrics = sequence_clip_loss(value, x.old, x.advantages, clip_low=clip_low, clip_high=clip_high,
                                     valid=valid)
    if kl_coef and x.ref is not None:
        per_seq = sequence_kl(value * length, x.ref * length, kl_kind, length=length,
                              k1_grad_correction=k1_grad_correction)
        w = torch.ones_like(per_seq) if valid is None else valid.to(per_seq.dtype)
        kl = (per_seq * w).sum() / w.sum().clamp_min(1)
        metrics = {**metrics, "kl": kl.detach()}
        pg = pg + kl_coef * kl
    return pg, metrics


@dataclass(frozen=True, kw_only=True)
class BGPO(DualClip, RLAlgorithm[MaskPlan]):
    """BGPO (Lin et al., arXiv 2510.11683): per-MC-sample linear lower bound of the ELBO ratio.

    N stratified-count masks; per sample the normalised ELBO l_i enters a PPO surrogate with
    ratio 1 + (l_i - l_i^old) for A > 0 and exp(.) otherwise; the loss is the mean over samples,
    each sample one scored row, so memory does not grow with N. Masked and block families.

    Attributes:
        mc_num: Monte-Carlo masks per sequence (one scored row each).
    """

    mc_num: int = 16
    families: ClassVar[tuple[str, ...]] = ALL_FAMILIES
    row_local = True

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> MaskPlan:
        return count_masks(inputs(batch)[3], self.mc_num, generator=generator)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: MaskPlan, iteration: int) -> torch.Tensor:
        return elbo(plan_logp(scorer, batch, data), data, normalizer=_elbo_normalizer(batch.rollout))

    def loss(self, values: torch.Tensor, inputs: LossInputs[MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        assert inputs.old is not None
        parts = [bgpo_policy_loss(values[:, i], inputs.old[:, i], inputs.advantages, inputs.batch.rollout.response_mask,
                                  clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual_clip)
                 for i in range(values.shape[1])]
        return torch.stack([p[0] for p in parts]).mean(), mean_metrics([p[1] for p in parts])


@dataclass(frozen=True, kw_only=True)
class ESPO(RatioClip, RLAlgorithm[list[tuple[MaskPlan, MaskPlan]]]):
    """ESPO (Ou et al., arXiv 2512.03759): sequence-level clipped ratio of antithetic ELBOs.

    Per iteration fresh count masks stratified across the batch plus their complements;
    l = ELBO / R; RLOO advantages; clipped sequence ratio + k2 KL to the reference on raw
    ELBOs / R. Off-policy: `num_iterations` optimizer steps per rollout batch.

    Attributes:
        mc_num: count masks per sequence and iteration (each scored with its complement).
        num_iterations: optimizer steps per rollout batch, each on fresh masks.
        kl_coef: weight of the sequence KL to the frozen reference (0: no reference model).
        kl_kind: estimator of that KL on the ELBO gap: "k1" (value Delta, gradient
            (1 + Delta) grad E as the official ESPO code), "k2", "k3" or "abs".
    """

    mc_num: int = 2
    num_iterations: int = 8
    kl_coef: float = 1e-3
    kl_kind: str = "k2"
    families: ClassVar[tuple[str, ...]] = MASKED

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_iterations < 1:
            raise ValueError(f"algorithm.num_iterations must be >= 1, got {self.num_iterations}")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return rloo_advantages(scores, group_ids)

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> list[tuple[MaskPlan, MaskPlan]]:
        return [espo_masks(inputs(batch)[3], self.mc_num, generator=generator) for _ in range(self.num_iterations)]

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: list[tuple[MaskPlan, MaskPlan]],
               iteration: int) -> torch.Tensor:
        p, c = data[iteration]
        width = float(batch.rollout.response_ids.shape[1])
        v = antithetic_elbo(plan_logp(scorer, batch, p), plan_logp(scorer, batch, c), p, c, normalizer=width)
        return v.mean(-1)

    def loss(self, values: torch.Tensor,
             inputs: LossInputs[list[tuple[MaskPlan, MaskPlan]]]) -> tuple[torch.Tensor, Metrics]:
        # DARE's ESPO k1 carries the official ESPO code's gradient correction; its EBPO k1 does not
        return _sequence_loss(values, inputs, clip_low=self.clip_low, clip_high=self.clip_high, kl_coef=self.kl_coef,
                              kl_kind=self.kl_kind, length=float(inputs.batch.rollout.response_ids.shape[1]),
                              k1_grad_correction=self.kl_kind in ("k1", "kl"))


@dataclass(frozen=True, kw_only=True)
class EBPO(RatioClip, RLAlgorithm[MaskPlan]):
    """EBPO (LLaDA2.1, arXiv 2602.08676 Eq. 4-5): clipped ratio of composite block ELBOs.

    Every response block of every MC row gets its own stratified count; with the BD3LM layout
    one forward per row scores all blocks; raw (unnormalised) composite ELBO; log-domain clipped
    sequence ratio. Block families only.

    Attributes:
        mc_num: Monte-Carlo rows per sequence (every block with its own stratified count).
        kl_coef: weight of the sequence KL to the frozen reference (0: no reference model).
        kl_kind: estimator of that KL on the ELBO gap: "k1", "k2", "k3" or "abs".
    """

    mc_num: int = 16
    kl_coef: float = 0.0
    kl_kind: str = "k2"
    families: ClassVar[tuple[str, ...]] = BLOCK

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> MaskPlan:
        rollout = batch.rollout
        if rollout.config is None or not rollout.config.block_diffusion:
            raise ValueError("EBPO is defined for block-diffusion models (SDAR, LLaDA2) only")
        _, attn, _, response_valid = inputs(batch)
        ids = block_ids(attn, rollout.config.block_length)
        return block_count_masks(response_valid, ids, self.mc_num, generator=generator)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: MaskPlan, iteration: int) -> torch.Tensor:
        return composite_block_elbo(plan_logp(scorer, batch, data), data)

    def loss(self, values: torch.Tensor, inputs: LossInputs[MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        # as the reference: sequences without a valid response token (EOS first) do not count
        return _sequence_loss(values, inputs, clip_low=self.clip_low, clip_high=self.clip_high, kl_coef=self.kl_coef,
                              kl_kind=self.kl_kind, length=1.0, valid=inputs.batch.rollout.response_mask.any(-1))


@dataclass(frozen=True, kw_only=True)
class SPG(RLAlgorithm[list[MaskPlan]]):
    """SPG (Wang et al., arXiv 2510.09541): ELBO for positive, ELBO/EUBO mix for negative rewards.

    Block-wise random masks (later blocks fully, one block partially, earlier blocks and the
    prompt at 15%); REINFORCE with length-weighted sequence advantages, no ratio, no old or
    reference values. `num_iterations` optimizer steps per rollout batch, each on its own mask
    set; the later ones are off-policy, yet the loss stays plain REINFORCE on the current policy.
    The values hold both estimators ([2, B]: the positive one, the negative one); the loss picks
    each sequence's by the sign of its advantage.

    Attributes:
        mc_num: block-wise masks per sequence and iteration.
        eubo_beta: beta of the EUBO (the upper bound used for negative advantages).
        mix_weight: w of the "mix" estimator, w EUBO + (1 - w) ELBO.
        negative: estimator for negative advantages: "mix", "eubo", "elbo" or "zero".
        block_length: block size of the masks (None: the rollout's block length).
        num_iterations: optimizer steps per rollout batch, each on its own mask set.
        prompt_mask_prob: iid masking rate of the prompt and the earlier (clean) blocks (SPG's
            `use_mask_prompt`, at 0.15; 0 leaves them unmasked).
    """

    mc_num: int = 1
    eubo_beta: float = 1.5
    mix_weight: float = 0.5
    negative: str = "mix"
    block_length: int | None = None
    num_iterations: int = 1
    prompt_mask_prob: float = 0.15
    families: ClassVar[tuple[str, ...]] = MASKED
    needs_old = False

    def __post_init__(self) -> None:
        if self.num_iterations < 1:
            raise ValueError(f"algorithm.num_iterations must be >= 1, got {self.num_iterations}")
        if not 0.0 <= self.prompt_mask_prob <= 1.0:
            raise ValueError(f"algorithm.prompt_mask_prob must be in [0, 1], got {self.prompt_mask_prob}")

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> list[MaskPlan]:
        rollout = batch.rollout
        _, _, prompt_valid, response_valid = inputs(batch)
        blk = self.block_length or (rollout.config.block_length if rollout.config else 32)
        return [spg_block_masks(prompt_valid, response_valid, self.mc_num, response_start=rollout.prompt_ids.shape[1],
                                block_length=blk, prompt_mask_prob=self.prompt_mask_prob, generator=generator) for _ in range(self.num_iterations)]

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: list[MaskPlan], iteration: int) -> torch.Tensor:
        masks = data[iteration]
        lp = plan_logp(scorer, batch, masks)
        valid = inputs(batch)[3]
        b = lp.shape[0]
        both = [spg_sequence_logp(lp, masks, valid, torch.full((b,), sign, dtype=torch.bool, device=lp.device),
                                  negative=self.negative, eubo_beta=self.eubo_beta, mix_weight=self.mix_weight)
                for sign in (True, False)]
        return torch.stack(both)

    def loss(self, values: torch.Tensor, inputs: LossInputs[list[MaskPlan]]) -> tuple[torch.Tensor, Metrics]:
        adv = inputs.advantages
        value = torch.where(adv > 0, values[0], values[1])
        return spg_loss(value, adv, inputs.batch.rollout.response_mask.sum(-1)), {}


__all__ = ["BGPO", "EBPO", "ESPO", "SPG"]
