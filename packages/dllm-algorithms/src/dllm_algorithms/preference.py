"""Preference optimisation on ELBOs: DPO and its variance-reduced form VRPO."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import MaskPlan, count_masks, iid_masks
from dllm_train import PreferenceObjective

from dllm_algorithms.families import MASKED


def _iid(valid: torch.Tensor, n: int, gen: torch.Generator) -> MaskPlan:
    return iid_masks(valid, n, eps=1e-3, generator=gen)


def _stratified(valid: torch.Tensor, n: int, gen: torch.Generator) -> MaskPlan:
    return count_masks(valid, n, generator=gen)


@dataclass(frozen=True)
class DPO:
    """DPO on diffusion ELBOs (Rafailov et al., arXiv 2305.18290): one iid-t mask per response,
    independent masks for policy and reference (docs/algorithms.md#dpo).

    Attributes:
        beta: DPO's beta (scale of the implicit reward).
        mc_num: masks per response for each ELBO.
    """

    beta: float = 0.1
    mc_num: int = 1
    families: ClassVar[tuple[str, ...]] = MASKED

    def build(self) -> PreferenceObjective:
        return PreferenceObjective(name="dpo", sample_plan=_iid, num_samples=self.mc_num, beta=self.beta,
                                   share_masks=False)


@dataclass(frozen=True)
class VRPO:
    """VRPO (LLaDA 1.5, arXiv 2505.19223): DPO on ELBOs with stratified counts (one mask per
    timestep), a larger budget and masks shared by policy and reference; ELBO ÷ R
    (docs/algorithms.md#vrpo).

    Attributes:
        beta: DPO's beta (scale of the implicit reward).
        mc_num: masks per response for each ELBO (stratified counts, shared with the reference).
    """

    beta: float = 0.2
    mc_num: int = 4
    families: ClassVar[tuple[str, ...]] = MASKED

    def build(self) -> PreferenceObjective:
        return PreferenceObjective(name="vrpo", sample_plan=_stratified, num_samples=self.mc_num, beta=self.beta,
                                   share_masks=True, normalize_by_width=True)
