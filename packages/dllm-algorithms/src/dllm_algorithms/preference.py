"""Preference optimisation on ELBOs: DPO and its variance-reduced form VRPO.

DPO (Rafailov et al., arXiv 2305.18290) needs log-likelihoods that a diffusion LM only bounds; the
ELBO replaces them (docs/algorithms.md#dpo). Variance-reduced variants (LLaDA 1.5, arXiv
2505.19223) use a larger budget, one mask per timestep (stratified counts) and the same masks for
policy and reference (antithetic sampling). `ELBOPreference` holds what such methods share (the
masks of both sides, their ELBOs under policy and reference); a method adds its mask sampler and
its loss, and `dllm_train.OfflineWorker` trains it.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import MaskPlan, count_masks, dpo_logits, dpo_loss, elbo, iid_masks
from dllm_train import OfflineInputs, OfflineObjective, ValuesScorer, plan_token_logp

from dllm_algorithms.families import MASKED
from dllm_algorithms.scoring import Metrics


@dataclass(frozen=True)
class PreferenceBatch:
    """Chosen and rejected sequences of the same prompts, each [B, S] (prompt + response).

    Attributes:
        chosen_ids, chosen_attention, chosen_response: ids, real tokens, response positions.
        rejected_ids, rejected_attention, rejected_response: the same for the rejected side.
    """

    chosen_ids: torch.Tensor
    chosen_attention: torch.Tensor
    chosen_response: torch.Tensor
    rejected_ids: torch.Tensor
    rejected_attention: torch.Tensor
    rejected_response: torch.Tensor


@dataclass(frozen=True)
class PairMasks:
    """The mask plans of one step, (chosen, rejected), each with mask [B, N, S].

    Attributes:
        policy: the policy's plans.
        reference: the reference's plans (the same objects when the method shares masks).
    """

    policy: tuple[MaskPlan, MaskPlan]
    reference: tuple[MaskPlan, MaskPlan]


class ELBOPreference(OfflineObjective[PreferenceBatch, PairMasks]):
    """A preference method on Monte-Carlo ELBOs of chosen/rejected responses: values are the
    [2, B] (chosen, rejected) ELBOs, MC-mean per response, under the policy and the reference.

    A subclass sets `mc_num` (masks per response), `sample_plan` and `loss`, and the constants:
        share_masks: the reference reuses the policy's masks (antithetic sampling).
        normalize_by_width: divide every ELBO by the padded width (DARE's VRPO `÷ R`).
    """

    mc_num: int
    row_local: ClassVar[bool] = False  # a pair's loss couples its two sides (and MC copies)
    families: ClassVar[tuple[str, ...]] = MASKED
    noise_stream: ClassVar[str] = "preference-mask"
    share_masks: ClassVar[bool] = True
    normalize_by_width: ClassVar[bool] = False
    constants = (*OfflineObjective.constants, "share_masks", "normalize_by_width")

    @property
    def needs_reference(self) -> bool:
        return True

    @abstractmethod
    def sample_plan(self, valid: torch.Tensor, generator: torch.Generator) -> MaskPlan:
        """`mc_num` masks of the response positions `valid` [B, S]."""

    def prepare(self, batch: PreferenceBatch, generator: torch.Generator) -> PairMasks:
        policy = (self.sample_plan(batch.chosen_response, generator),
                  self.sample_plan(batch.rejected_response, generator))
        if self.share_masks:
            return PairMasks(policy=policy, reference=policy)
        return PairMasks(policy=policy, reference=(self.sample_plan(batch.chosen_response, generator),
                                                   self.sample_plan(batch.rejected_response, generator)))

    def _elbos(self, scorer: ValuesScorer, batch: PreferenceBatch, plans: tuple[MaskPlan, MaskPlan]) -> torch.Tensor:
        sides = ((batch.chosen_ids, batch.chosen_attention), (batch.rejected_ids, batch.rejected_attention))
        norm = "padded" if self.normalize_by_width else None
        return torch.stack([elbo(plan_token_logp(scorer, ids, attn, plan), plan, normalizer=norm).mean(-1)
                            for (ids, attn), plan in zip(sides, plans)])

    def values(self, scorer: ValuesScorer, batch: PreferenceBatch, data: PairMasks) -> torch.Tensor:
        """[2, B] (chosen, rejected) ELBOs under `scorer` on the policy's masks."""
        return self._elbos(scorer, batch, data.policy)

    def reference_values(self, scorer: ValuesScorer, batch: PreferenceBatch, data: PairMasks) -> torch.Tensor:
        """[2, B] (chosen, rejected) ELBOs under `scorer` on the reference's masks."""
        return self._elbos(scorer, batch, data.reference)


def dpo_on_elbos(values: torch.Tensor, ref: torch.Tensor | None, beta: float) -> tuple[torch.Tensor, Metrics]:
    """DPO loss of [2, B] policy and reference ELBOs, with the reward margin and pair accuracy.

    Returns:
        (scalar loss, {"reward_margin": mean DPO logit, "pair_accuracy": share of logits > 0}).
    """
    assert ref is not None, "a DPO loss needs the reference values"
    loss = dpo_loss(values[0], values[1], ref[0], ref[1], beta=beta)
    logits = dpo_logits(values[0].detach(), values[1].detach(), ref[0], ref[1], beta=beta)
    return loss, {"reward_margin": logits.mean(), "pair_accuracy": (logits > 0).float().mean()}


def _check(name: str, beta: float, mc_num: int) -> None:
    if not beta > 0 or mc_num < 1:
        raise ValueError(f"{name}: algorithm.beta must be > 0 and algorithm.mc_num >= 1, got beta={beta}, "
                         f"mc_num={mc_num}")


@dataclass(frozen=True)
class DPO(ELBOPreference):
    """DPO on diffusion ELBOs (Rafailov et al., arXiv 2305.18290): one iid-t mask per response,
    independent masks for policy and reference (docs/algorithms.md#dpo).

    Attributes:
        beta: DPO's beta (scale of the implicit reward).
        mc_num: masks per response for each ELBO.
    """

    beta: float = 0.1
    mc_num: int = 1
    share_masks = False

    def __post_init__(self) -> None:
        _check("dpo", self.beta, self.mc_num)

    def sample_plan(self, valid: torch.Tensor, generator: torch.Generator) -> MaskPlan:
        return iid_masks(valid, self.mc_num, eps=1e-3, generator=generator)

    def loss(self, values: torch.Tensor, inputs: OfflineInputs[PreferenceBatch, PairMasks]) -> tuple[torch.Tensor, Metrics]:
        return dpo_on_elbos(values, inputs.ref, self.beta)


@dataclass(frozen=True)
class VRPO(ELBOPreference):
    """VRPO (LLaDA 1.5, arXiv 2505.19223): DPO on ELBOs with stratified counts (one mask per
    timestep), a larger budget and masks shared by policy and reference; ELBO ÷ R
    (docs/algorithms.md#vrpo).

    Attributes:
        beta: DPO's beta (scale of the implicit reward).
        mc_num: masks per response for each ELBO (stratified counts, shared with the reference).
    """

    beta: float = 0.2
    mc_num: int = 4
    share_masks = True
    normalize_by_width = True

    def __post_init__(self) -> None:
        _check("vrpo", self.beta, self.mc_num)

    def sample_plan(self, valid: torch.Tensor, generator: torch.Generator) -> MaskPlan:
        return count_masks(valid, self.mc_num, generator=generator)

    def loss(self, values: torch.Tensor, inputs: OfflineInputs[PreferenceBatch, PairMasks]) -> tuple[torch.Tensor, Metrics]:
        return dpo_on_elbos(values, inputs.ref, self.beta)


__all__ = ["DPO", "ELBOPreference", "PairMasks", "PreferenceBatch", "VRPO", "dpo_on_elbos"]
