"""The mask plan: one or more noised copies of a batch, shared by old/ref/new passes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["MaskPlan", "apply_mask"]


@dataclass(frozen=True)
class MaskPlan:
    """Masks sampled once and reused for the old, reference and current policy passes.

    Common random numbers between the three passes make the importance ratio exactly 1
    on-policy (docs/algorithms.md#notation, shared noise).

    Attributes:
        mask: bool ``[B, N, L]``, True where the position is replaced by the mask token.
        p_mask: float ``[B, N, L]``, the marginal probability that the position was masked
            under the sampling scheme (the ``pi_j`` of docs/algorithms.md#elbo); read only where ``mask``.
        meta: scheme-specific extras, e.g. ``t`` ``[B, N]``, ``counts`` ``[B, N]``,
            ``denominator`` ``[B, N]``, ``block_index`` ``[B, N]``.
    """

    mask: Tensor
    p_mask: Tensor
    meta: dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mask.dtype != torch.bool or self.mask.dim() != 3:
            raise ValueError(
                f"MaskPlan.mask must be a bool tensor [B, N, L], got dtype {self.mask.dtype} "
                f"and shape {tuple(self.mask.shape)}."
            )
        if self.p_mask.shape != self.mask.shape:
            raise ValueError(
                f"MaskPlan.p_mask has shape {tuple(self.p_mask.shape)} but mask has shape "
                f"{tuple(self.mask.shape)}; they must match."
            )

    @property
    def num_samples(self) -> int:
        """Number of noised copies ``N`` per sequence."""
        return int(self.mask.shape[1])


def apply_mask(input_ids: Tensor, plan: MaskPlan, mask_id: int) -> Tensor:
    """Replace the planned positions of every copy by ``mask_id``.

    Args:
        input_ids: long ``[B, L]`` clean tokens.
        plan: a plan with ``mask`` ``[B, N, L]``.
        mask_id: the model's mask token id (a model constant: pass it in, never hard-code it).

    Returns:
        long ``[B, N, L]`` noisy ids ``z``.
    """
    if input_ids.dim() != 2 or input_ids.shape != (plan.mask.shape[0], plan.mask.shape[2]):
        raise ValueError(
            f"input_ids must have shape [B, L] = {(plan.mask.shape[0], plan.mask.shape[2])} "
            f"to match plan.mask {tuple(plan.mask.shape)}, got {tuple(input_ids.shape)}."
        )
    clean = input_ids.unsqueeze(1).expand_as(plan.mask)
    return torch.where(plan.mask, torch.full_like(clean, mask_id), clean)
