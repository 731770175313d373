"""Preference loss: DPO on sequence log-likelihoods or VRPO ELBOs (docs/algorithms.md#dpo, #vrpo)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ._checks import check_finite, check_nonempty, check_same_shape

__all__ = ["dpo_loss", "dpo_logits"]


def dpo_logits(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float,
    length_normalizer: float | Tensor = 1.0,
) -> Tensor:
    """DPO logit ``beta [(pi_w - pi_l) - (ref_w - ref_l)] / length_normalizer`` per pair.

    Args:
        policy_chosen, policy_rejected, ref_chosen, ref_rejected: ``[P]`` sequence values
            (log-likelihoods or MC-mean ELBOs ``elbo(...).mean(-1)`` on shared masks).
        beta: inverse temperature (> 0).
        length_normalizer: divisor of every value; DARE's VRPO divides by the padded
            response length ``R`` (effective ``beta / R``), LLaDA 1.5 uses 1.

    Returns:
        float32 ``[P]``.
    """
    check_same_shape(
        policy_chosen=policy_chosen, policy_rejected=policy_rejected,
        ref_chosen=ref_chosen, ref_rejected=ref_rejected,
    )
    check_nonempty("policy_chosen", policy_chosen)
    check_finite(beta=beta, length_normalizer=length_normalizer)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}; VRPO uses 0.2.")
    margin = (policy_chosen.float() - policy_rejected.float()) - (ref_chosen.float() - ref_rejected.float())
    return beta * margin / length_normalizer


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float,
    length_normalizer: float | Tensor = 1.0,
) -> Tensor:
    """DPO loss ``mean -log sigmoid(logit)`` (Rafailov et al. 2023; VRPO arXiv 2505.19223).

    Equals ``log 2`` when the policy equals the reference on shared masks.

    Args: as :func:`dpo_logits`.

    Returns:
        float32 scalar.
    """
    z = dpo_logits(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected,
        beta=beta, length_normalizer=length_normalizer,
    )
    return -F.logsigmoid(z).mean()
