"""Clipped policy-gradient losses: token PPO with dual clip, BGPO, sequence-level clip
(docs/algorithms.md#clipped-surrogate, #aggregation).

All ratio math runs in float32. Losses return ``(loss, metrics)``; metrics are detached scalars.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice, check_finite, check_same_shape
from .kl import kl_penalty, sequence_kl

__all__ = [
    "AGG_MODES",
    "aggregate",
    "clipped_policy_loss",
    "bgpo_policy_loss",
    "sequence_clip_loss",
    "gdpo_loss",
    "weighted_policy_loss",
    "token_surrogate",
]

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(
    values: Tensor, mask: Tensor, mode: str = "token-mean", *, norm_const: float | None = None
) -> Tensor:
    """Reduce a token matrix to a scalar (verl ``agg_loss``; docs/algorithms.md#aggregation).

    * ``token-mean``: ``sum(m v) / (sum(m) + 1e-8)``.
    * ``seq-mean-token-sum``: ``mean_i sum_j m v``.
    * ``seq-mean-token-mean``: ``mean_i (sum_j m v / sum_j m)``; rows without a valid token
      contribute 0 (the reference would return NaN).
    * ``seq-mean-token-sum-norm``: ``sum(m v) / R`` with ``R = norm_const or values.shape[-1]``
      (Dr.GRPO).

    Args:
        values: ``[..., R]`` (leading dims are sequences).
        mask: bool ``[..., R]``.
        mode: one of :data:`AGG_MODES`.
        norm_const: the constant of ``seq-mean-token-sum-norm`` (> 0: it divides the sum).

    Returns:
        float32 scalar.
    """
    check_choice("agg mode", mode, AGG_MODES)
    check_same_shape(values=values, mask=mask)
    check_finite(norm_const=norm_const)
    if norm_const is not None and norm_const <= 0:
        raise ValueError(f"norm_const must be > 0 (the sum is divided by it; 0 gives an infinite loss, a "
                         f"negative value flips its sign), got {norm_const}; pass None for the response length.")
    m = mask.float()
    mv = values.float() * m
    if mode == "token-mean":
        return mv.sum() / (m.sum() + 1e-8)
    if mode == "seq-mean-token-sum-norm":
        return mv.sum() / float(norm_const if norm_const is not None else values.shape[-1])
    seq = mv.reshape(-1, values.shape[-1]).sum(-1)
    if mode == "seq-mean-token-mean":
        seq = seq / m.reshape(-1, values.shape[-1]).sum(-1).clamp_min(1)
    return seq.mean()


def _check_clips(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    check_finite(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low must lie in [0, 1], got {clip_low}; the ratio floor is 1 - clip_low.")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}.")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}; the default is 3.0.")


def _broadcast_adv(advantages: Tensor, like: Tensor) -> Tensor:
    """Advantages ``[B]`` or ``[B, R]`` as float32 ``[B, R]``."""
    adv = advantages.float()
    if adv.dim() == like.dim() - 1:
        adv = adv.unsqueeze(-1)
    if adv.dim() != like.dim() or adv.shape[0] != like.shape[0]:
        raise ValueError(
            f"advantages must have shape [B] or {list(like.shape)}, got {tuple(advantages.shape)}."
        )
    return adv.expand_as(like)


def token_surrogate(
    ratio: Tensor, adv: Tensor, *, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO loss with dual clip from ratios and advantages of one shape.

    Returns:
        ``(loss, clipped, dual_clipped)``: float32 loss tokens and two bool indicator tensors.
    """
    _check_clips(clip_low, clip_high, dual_clip)
    u1 = -adv * ratio
    u2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    u = torch.maximum(u1, u2)
    clipped = u2 > u1
    if dual_clip is None:
        return u, clipped, torch.zeros_like(clipped)
    cap = -adv * dual_clip
    neg = adv < 0
    dual = neg & (u > cap)
    return torch.where(neg, torch.minimum(u, cap), u), clipped, dual


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    norm_const: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with dual clip for negative advantages (docs/algorithms.md#clipped-surrogate).

    ``r = exp(l - l_old)``, ``u = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, token loss
    ``min(u, -A c)`` for ``A < 0`` (Ye et al. 2020 dual clip), ``u`` otherwise, then
    :func:`aggregate`. Used by d1, Coupled-GRPO, CJ-GRPO, JustGRPO; equal clips = GRPO,
    ``clip_high > clip_low`` = DAPO clip-higher.

    Args:
        logp: ``[B, R]`` current per-token values (log-probs or Coupled scores).
        old_logp: ``[B, R]`` values under the behaviour policy on the same masks.
        advantages: ``[B]`` or ``[B, R]``.
        mask: bool ``[B, R]``, tokens that enter the loss.
        clip_low, clip_high: clip range of the ratio.
        dual_clip: ``c > 1``; ``None`` disables the dual clip.
        agg: aggregation mode (:data:`AGG_MODES`).
        norm_const: constant of ``seq-mean-token-sum-norm``; JustGRPO position chunks pass the
            full response token count so that the chunk losses sum to one token-mean.

    Returns:
        ``(loss, metrics)`` with metrics ``clip_frac``, ``clip_frac_lower`` (dual clip active),
        ``ppo_kl`` (token-mean k3 of KL(old || new)) and ``ratio_mean``.
    """
    check_same_shape(logp=logp, old_logp=old_logp, mask=mask)
    lp, old = logp.float(), old_logp.float()
    ratio = torch.exp(lp - old)
    adv = _broadcast_adv(advantages, lp)
    tok, clipped, dual = token_surrogate(
        ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    loss = aggregate(tok, mask, agg, norm_const=norm_const)
    with torch.no_grad():
        metrics = {
            "clip_frac": aggregate(clipped.float(), mask),
            "clip_frac_lower": aggregate(dual.float(), mask),
            "ppo_kl": aggregate(kl_penalty(old, lp, "k3"), mask),
            "ratio_mean": aggregate(ratio, mask),
        }
    return loss, metrics


def bgpo_policy_loss(
    value: Tensor,
    old_value: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, Tensor]]:
    """BGPO loss of one Monte-Carlo sample (Lin et al., arXiv 2510.11683; docs/algorithms.md#bgpo).

    With ``D = value - old_value`` the ratio is ``1 + D`` for ``A > 0`` (first-order Taylor, a
    lower bound of ``exp(D)``) and ``exp(D)`` otherwise, then the PPO surrogate over the
    broadcast sequence value. Divide by ``N`` and sum over samples (one backward each:
    :func:`dllm_objectives.per_sample_backward`). The linear ratio is used directly, so there
    is no NaN for ``D <= -1`` (the reference computed ``exp(log(1 + D))``).

    Args:
        value: ``[B]`` normalised ELBO of this sample (``elbo(..., normalizer=...)[:, i]``).
        old_value: ``[B]`` the same under the old policy on the same mask.
        advantages: ``[B]``.
        mask: bool ``[B, R]`` response mask the sequence value is broadcast over.
        clip_low, clip_high, dual_clip, agg: as in :func:`clipped_policy_loss`.

    Returns:
        ``(loss, metrics)`` with ``clip_frac`` and ``ratio_mean``.
    """
    check_same_shape(value=value, old_value=old_value, advantages=advantages)
    delta = value.float() - old_value.float()
    adv = advantages.float()
    ratio = torch.where(adv > 0, 1.0 + delta, torch.exp(delta))
    ratio_tok = ratio[:, None].expand(mask.shape)
    tok, clipped, _ = token_surrogate(
        ratio_tok, adv[:, None].expand(mask.shape), clip_low=clip_low, clip_high=clip_high,
        dual_clip=dual_clip,
    )
    loss = aggregate(tok, mask, agg)
    with torch.no_grad():
        metrics = {"clip_frac": aggregate(clipped.float(), mask), "ratio_mean": ratio.mean()}
    return loss, metrics


def sequence_clip_loss(
    value: Tensor,
    old_value: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    valid: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Sequence-level clipped ratio in the log domain (ESPO, EBPO; docs/algorithms.md#ebpo).

    ``rho = value - old_value``; ``rho~ = min(rho, log(1 + clip_high))`` if ``A >= 0`` else
    ``max(rho, log(1 - clip_low))``; loss ``mean_i(-A_i exp(rho~_i))``. Equal to
    ``max(-A r, -A clip(r))`` for every input, and finite for ``|rho| >> 1``. No dual clip.

    Args:
        value: ``[B]`` sequence ELBO (ESPO: antithetic ELBO / R; EBPO: raw composite ELBO).
        old_value: ``[B]`` the same under the old policy.
        advantages: ``[B]`` (:func:`sequence_advantages`).
        clip_low, clip_high: clip range (``clip_low=1`` removes the lower bound; ESPO
            countdown uses 0.0/0.0).
        valid: optional bool ``[B]``, sequences that enter the mean.

    Returns:
        ``(loss, metrics)`` with ``clip_frac`` (the share of sequences, among ``valid``, with
        ``rho > log(1 + clip_high)`` and ``A > 0`` or ``rho < log(1 - clip_low)`` and ``A < 0``) and
        ``ratio_mean``.
    """
    _check_clips(clip_low, clip_high, None)
    check_same_shape(value=value, old_value=old_value, advantages=advantages)
    rho = value.float() - old_value.float()
    adv = advantages.float()
    hi = torch.full_like(rho, torch.log1p(torch.tensor(clip_high)).item())
    lo = torch.full_like(rho, torch.log1p(torch.tensor(-clip_low)).item())
    eff = torch.where(adv >= 0, torch.minimum(rho, hi), torch.maximum(rho, lo))
    per_seq = -adv * torch.exp(eff)
    w = torch.ones_like(per_seq) if valid is None else valid.float()
    loss = (per_seq * w).sum() / w.sum().clamp_min(1)
    with torch.no_grad():
        # a clip that moves the loss: rho above the upper bound with A > 0 or below the lower with
        # A < 0 (A = 0 sequences carry no gradient and are never counted)
        clipped = (((rho > hi) & (adv > 0)) | ((rho < lo) & (adv < 0))).float()
        metrics = {
            "clip_frac": (clipped * w).sum() / w.sum().clamp_min(1),
            "ratio_mean": torch.exp(rho.clamp(max=80.0)).mean(),
        }
    return loss, metrics


def gdpo_loss(
    elbo: Tensor,
    old_elbo: Tensor,
    advantages: Tensor,
    *,
    length: float,
    clip_low: float = 0.5,
    clip_high: float = 0.5,
    ref_elbo: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GDPO's loss: a clipped ratio of length-normalised sequence ELBOs plus a k3 KL (arXiv 2510.08554).

    ``r = exp((E - E_old) / length)``; per sequence ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)
    + kl_coef * (exp(E_ref - E) - (E_ref - E) - 1)`` (the KL on raw ELBOs), averaged over the batch.
    The ratio term is :func:`sequence_clip_loss` on ``E / length``.

    Args:
        elbo: ``[B]`` sequence ELBO of the current policy (:func:`dllm_objectives.quadrature_elbo`).
        old_elbo: ``[B]`` the same under the rollout policy on the same masks.
        advantages: ``[B]`` (GDPO: ``r - mean_group``, no std).
        length: > 0, the ratio's normaliser (GDPO: the padded response width).
        clip_low, clip_high: clip range (GDPO's scripts: 0.5 and 0.5).
        ref_elbo: ``[B]`` under the reference model (None: no KL term).
        kl_coef: KL weight (GDPO's scripts: 0).

    Returns:
        ``(loss, metrics)`` with ``clip_frac``, ``ratio_mean`` and, with a KL term, ``kl``.
    """
    check_finite(length=length, kl_coef=kl_coef)
    if length <= 0:
        raise ValueError(f"length must be > 0 (GDPO: the padded response width), got {length}.")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}.")
    loss, metrics = sequence_clip_loss(elbo / length, old_elbo / length, advantages,
                                       clip_low=clip_low, clip_high=clip_high)
    if kl_coef and ref_elbo is not None:
        kl = sequence_kl(elbo, ref_elbo, "k3").mean()
        loss = loss + kl_coef * kl
        metrics = {**metrics, "kl": kl.detach()}
    return loss, metrics


def weighted_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Token surrogate reduced as ``sum(weights * loss_token)`` (CJ-GRPO, docs/algorithms.md#cj-grpo).

    Args:
        logp, old_logp: ``[B, ..., R]`` (e.g. ``[B, K, R]`` step log-probs, or one step ``[B, R]``).
        advantages: ``[B]`` (broadcast over the other axes) or the full shape.
        weights: float, same shape as ``logp`` (:func:`cj_token_weights`), 0 where unused.

    Returns:
        ``(loss, metrics)`` with ``clip_frac`` (weighted).
    """
    check_same_shape(logp=logp, old_logp=old_logp, weights=weights)
    lp, old = logp.float(), old_logp.float()
    ratio = torch.exp(lp - old)
    adv = advantages.float()
    while adv.dim() < lp.dim():
        adv = adv.unsqueeze(-1)
    adv = adv.expand_as(lp)
    tok, clipped, _ = token_surrogate(
        ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    w = weights.float()
    loss = (tok * w).sum()
    with torch.no_grad():
        metrics = {"clip_frac": (clipped.float() * w).sum() / w.sum().clamp_min(1e-12)}
    return loss, metrics
