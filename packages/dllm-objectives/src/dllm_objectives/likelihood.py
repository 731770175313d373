"""Likelihood estimators over precomputed per-token log-probs (docs/algorithms.md#elbo).

The caller runs its model on the noisy copies of a :class:`MaskPlan` and passes back aligned
per-target log-probs ``token_logp`` ``[B, N, L]`` (float32). Nothing here calls a model.
"""

from __future__ import annotations

from typing import TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_finite, check_same_shape
from .plan import MaskPlan

__all__ = [
    "token_logp_from_logits",
    "elbo_terms",
    "elbo",
    "antithetic_elbo",
    "coupled_token_logp",
    "composite_block_elbo",
]

Normalizer: TypeAlias = None | float | str | Tensor


def token_logp_from_logits(logits: Tensor, targets: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Log-probability of each target token, ``log softmax(logits / temperature)[target]``.

    The log-softmax runs in float32 even for bf16/fp16 logits (docs/algorithms.md#numerics).

    Args:
        logits: ``[..., V]``, already aligned with ``targets`` (shifting is the model adapter's job).
        targets: long ``[...]``.
        temperature: > 0; only JustGRPO uses a learner temperature (docs/algorithms.md#justgrpo).

    Returns:
        float32 ``[...]``.
    """
    check_finite(temperature=temperature)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; use 1.0 for no scaling.")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} plus a vocab axis."
        )
    logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def elbo_terms(token_logp: Tensor, plan: MaskPlan) -> Tensor:
    """Importance-weighted terms ``mask * token_logp / p_mask`` (docs/algorithms.md#elbo).

    Args:
        token_logp: ``[B, N, L]`` log-probs of the clean tokens given each noisy copy.
        plan: the plan the copies were built from.

    Returns:
        float32 ``[B, N, L]``, exactly 0 at unmasked positions (also where ``token_logp`` is
        not finite there).
    """
    check_same_shape(token_logp=token_logp, mask=plan.mask)
    lp = token_logp.float()
    p = torch.where(plan.mask, plan.p_mask.float(), torch.ones_like(lp))
    if bool((p <= 0).any()):
        raise ValueError("plan.p_mask must be > 0 wherever plan.mask is True; the plan is inconsistent.")
    return torch.where(plan.mask, lp / p, torch.zeros_like(lp))


def _apply_normalizer(values: Tensor, normalizer: Normalizer, width: int) -> Tensor:
    """Divide ``[B, N]`` values by a normaliser (see :func:`elbo`)."""
    if normalizer is None:
        return values
    if isinstance(normalizer, str):
        if normalizer != "padded":
            raise ValueError(
                f"unknown normalizer={normalizer!r}; valid: None, 'padded', a number or a [B] tensor."
            )
        return values / width
    if isinstance(normalizer, Tensor):
        denom = normalizer.float()
        if denom.dim() == 1:
            denom = denom[:, None]
        return values / denom.clamp_min(1e-12)
    if normalizer <= 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}.")
    return values / float(normalizer)


def elbo(token_logp: Tensor, plan: MaskPlan, *, normalizer: Normalizer = None) -> Tensor:
    """Per-copy ELBO estimate ``sum_{j in S} token_logp_j / p_mask_j`` (docs/algorithms.md#elbo).

    Unbiased for ``log p(o)`` when the denoiser returns exact conditionals and the plan is
    :func:`count_masks` (``k ~ U{1..L}``) or :func:`iid_masks` (``t ~ U(0, 1)``).

    Args:
        token_logp: ``[B, N, L]``.
        plan: the plan.
        normalizer: ``None`` (raw; canonical, EBPO), ``"padded"`` (divide by the padded width
            ``L``: LLaDA/Dream BGPO, VRPO, ESPO in DARE), a number, or a tensor ``[B]``
            (e.g. ``valid.sum(-1)``: SDAR/LLaDA2 BGPO).

    Returns:
        float32 ``[B, N]``; average over ``N`` for the Monte-Carlo estimate.
    """
    values = elbo_terms(token_logp, plan).sum(-1)
    return _apply_normalizer(values, normalizer, token_logp.shape[-1])


def antithetic_elbo(
    token_logp: Tensor,
    complement_logp: Tensor,
    plan: MaskPlan,
    complement: MaskPlan,
    *,
    normalizer: Normalizer = None,
) -> Tensor:
    """ESPO antithetic ELBO ``(E(S) + E(S^c)) / 2`` per copy (arXiv 2512.03759; docs/algorithms.md#espo).

    Empty sums are 0 and the factor 1/2 is always applied, as in the reference.

    Args:
        token_logp, complement_logp: ``[B, N, L]`` log-probs on the copies of ``plan`` and
            ``complement`` (from :func:`espo_masks`).
        plan, complement: the two plans.
        normalizer: as in :func:`elbo` (ESPO in DARE: ``"padded"``).

    Returns:
        float32 ``[B, N]``.
    """
    both = elbo(token_logp, plan) + elbo(complement_logp, complement)
    return _apply_normalizer(0.5 * both, normalizer, token_logp.shape[-1])


def coupled_token_logp(full_logp: Tensor, half_logp: Tensor, plan: MaskPlan) -> Tensor:
    """Coupled-GRPO per-token score (DiffuCoder, arXiv 2506.20639; docs/algorithms.md#coupled-grpo).

    ``0.5 * (l_full + [j in S_a] l_a / t + [j in S_b] l_b / (1 - t))``: a variance-reduced,
    re-weighted per-token score, not a log-probability.

    Args:
        full_logp: ``[B, L]`` log-probs with every valid response position masked.
        half_logp: ``[B, 2, L]`` log-probs on the two halves of ``plan``.
        plan: a :func:`coupled_masks` plan with ``N = 2``.

    Returns:
        float32 ``[B, L]`` (0 outside the plan's valid positions).
    """
    if plan.num_samples != 2:
        raise ValueError(
            "plan must be the N=2 coupled plan (coupled_masks(include_full=False)), "
            f"got N={plan.num_samples}."
        )
    halves = elbo_terms(half_logp, plan).sum(1)
    covered = plan.mask.any(1)
    full = torch.where(covered, full_logp.float(), torch.zeros_like(halves))
    return 0.5 * (full + halves)


def composite_block_elbo(
    token_logp: Tensor, plan: MaskPlan, *, sample_weights: Tensor | None = None
) -> Tensor:
    """EBPO composite block ELBO ``sum_n w_n sum_j e_nj`` (LLaDA2.1, arXiv 2602.08676;
    docs/algorithms.md#ebpo).

    With a :func:`block_count_masks` plan and BD3LM attention, every row's sum is the sum of
    per-block conditional ELBOs. Raw: no length normalisation.

    Args:
        token_logp: ``[B, N, L]``.
        plan: the per-block count plan.
        sample_weights: ``[N]`` weights ``w_n`` (default uniform ``1 / N``).

    Returns:
        float32 ``[B]``.
    """
    per_row = elbo(token_logp, plan)
    n = per_row.shape[-1]
    w = torch.full((n,), 1.0 / n, device=per_row.device) if sample_weights is None else sample_weights
    if w.shape != (n,):
        raise ValueError(f"sample_weights must have shape [N] = [{n}], got {tuple(w.shape)}.")
    return (per_row * w.float()).sum(-1)
