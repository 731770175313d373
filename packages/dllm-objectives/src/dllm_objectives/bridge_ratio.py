"""BridgeRatio: the policy ratio estimated directly from shared denoising paths (CURE-RLVR).

BridgeRatio-GRPO (CURE-RLVR; DARE PR #21, docs/algorithms.md#bridgeratio-grpo) scores the same
K noisy copies ("paths" tau_k of the forward corruption process) under the current and the old
policy and estimates the sequence ratio as

    log r = logsumexp_k l_theta(tau_k) - logsumexp_k l_old(tau_k),

a ratio of two importance-sampled likelihood estimates on common random numbers, instead of
the difference of two separately estimated log-likelihoods. Optional corrections reduce its
O(1/K) bias. The ratio then enters the PPO clipped surrogate with dual clip.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice, check_same_shape
from .policy import _broadcast_adv, aggregate, token_surrogate

__all__ = ["BRIDGE_CORRECTIONS", "bridge_log_ratio", "bridge_ratio_policy_loss"]

BRIDGE_CORRECTIONS = ("none", "delta", "jackknife", "cumulant")
"""Bias corrections of :func:`bridge_log_ratio`."""


def _cv_squared(log_w: Tensor, eps: float) -> Tensor:
    """Squared coefficient of variation over dim 1 of the weights ``exp(log_w)`` (shift-invariant)."""
    w = torch.exp(log_w - log_w.max(dim=1, keepdim=True).values)
    mean = w.mean(dim=1)
    var = (w - mean.unsqueeze(1)).square().mean(dim=1)
    return var / mean.square().clamp_min(eps)


def _lse_ratio(new: Tensor, old: Tensor) -> Tensor:
    return torch.logsumexp(new, dim=1) - torch.logsumexp(old, dim=1)


def bridge_log_ratio(
    path_scores: Tensor,
    old_path_scores: Tensor,
    *,
    correction: str = "none",
    detach_correction: bool = True,
    eps: float = 1e-8,
) -> tuple[Tensor, dict[str, Tensor]]:
    """BridgeRatio estimate of ``log p_theta(o | q) / p_old(o | q)`` from K shared paths.

    ``log r = logsumexp_k l_k - logsumexp_k l_old_k`` (the ``log K`` terms cancel). Corrections:

    * ``"delta"``: adds ``(CV^2(w) - CV^2(w_old)) / (2K)`` with ``w_k = exp(l_k)`` (the delta
      method's first-order bias of ``log mean w``);
    * ``"jackknife"``: ``K log r - (K - 1) mean_i log r_(-i)`` over leave-one-path-out
      estimates (no change for ``K = 1``);
    * ``"cumulant"``: with ``d_k = l_k - l_old_k`` and ``v = softmax_k(l_old)``,
      ``log r = E_v[d] + Var_v[d] / 2`` (second-order cumulant expansion).

    Args:
        path_scores: ``[B, K]`` (or ``[B, K, ...]``, reduced over dim 1) score of each path under
            the current policy (a per-path ELBO estimate, e.g. :func:`elbo` on a coupled plan).
        old_path_scores: the same paths under the old policy.
        correction: one of :data:`BRIDGE_CORRECTIONS`.
        detach_correction: stop the gradient through the ``"delta"`` term and the
            ``"cumulant"`` weights.
        eps: floor of the squared mean in the CV^2 of ``"delta"``.

    Returns:
        ``(log_ratio, metrics)``: float32 ``[B]`` (or ``[B, ...]``), and detached scalars
        ``bridge_log_ratio``, ``bridge_log_ratio_abs``, ``bridge_ratio_mean``, ``bridge_ratio_max``
        (ratios clamped to ``exp(+-30)``), ``bridge_correction`` (estimate minus the plain one)
        and ``bridge_num_paths``.
    """
    check_choice("correction", correction, BRIDGE_CORRECTIONS)
    check_same_shape(path_scores=path_scores, old_path_scores=old_path_scores)
    if path_scores.dim() < 2:
        raise ValueError(f"path_scores must be [B, K] (or [B, K, ...]), got shape {tuple(path_scores.shape)}.")
    new, old = path_scores.float(), old_path_scores.float()
    k = new.shape[1]
    plain = _lse_ratio(new, old)
    log_ratio = plain
    if correction == "delta":
        term = 0.5 / max(k, 1) * (_cv_squared(new, eps) - _cv_squared(old, eps))
        log_ratio = plain + (term.detach() if detach_correction else term)
    elif correction == "jackknife" and k > 1:
        loo = torch.stack([_lse_ratio(torch.cat([new[:, :i], new[:, i + 1:]], 1),
                                      torch.cat([old[:, :i], old[:, i + 1:]], 1)) for i in range(k)], 1)
        log_ratio = k * plain - (k - 1) * loo.mean(dim=1)
    elif correction == "cumulant":
        d = new - old
        v = torch.softmax(old, dim=1)
        v = v.detach() if detach_correction else v
        mean = (v * d).sum(dim=1)
        log_ratio = mean + 0.5 * (v * (d - mean.unsqueeze(1)).square()).sum(dim=1)
    with torch.no_grad():
        ratio = torch.exp(log_ratio.clamp(-30.0, 30.0))
        metrics = {
            "bridge_log_ratio": log_ratio.mean(),
            "bridge_log_ratio_abs": log_ratio.abs().mean(),
            "bridge_ratio_mean": ratio.mean(),
            "bridge_ratio_max": ratio.max(),
            "bridge_correction": (log_ratio - plain).mean(),
            "bridge_num_paths": torch.tensor(float(k), device=log_ratio.device),
        }
    return log_ratio, metrics


def bridge_ratio_policy_loss(
    path_scores: Tensor,
    old_path_scores: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    correction: str = "none",
    detach_correction: bool = True,
    log_ratio_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """BridgeRatio-GRPO loss: the PPO clipped surrogate on the bridge ratio (docs/algorithms.md#bridgeratio-grpo).

    ``r = exp(clamp(log r, -c_log, c_log))`` with ``log r`` from :func:`bridge_log_ratio`,
    broadcast over the response; token loss ``max(-A r, -A clip(r))`` (dual clip
    ``min(., -A c)`` for ``A < 0``), aggregated over ``mask``. On-policy ``r = 1`` and the
    gradient is ``-A`` times the ``softmax_k(l_old)``-weighted mean of the path-score gradients.

    Args:
        path_scores, old_path_scores: ``[B, K]`` path scores (current, old).
        advantages: ``[B]`` (broadcast over the response) or ``[B, R]``.
        mask: bool ``[B, R]`` response positions the sequence ratio is broadcast over.
        clip_low, clip_high, dual_clip, agg: as in :func:`clipped_policy_loss`.
        correction, detach_correction: as in :func:`bridge_log_ratio`.
        log_ratio_clip: clamp of ``log r`` before the exponential (None: off).

    Returns:
        ``(loss, metrics)``: float32 scalar; ``clip_frac``, ``dual_clip_frac``, ``ppo_kl``
        (masked mean of ``exp(-log r) + log r - 1``) and the :func:`bridge_log_ratio` metrics.
    """
    if path_scores.dim() != 2:
        raise ValueError(f"path_scores must be [B, K], got shape {tuple(path_scores.shape)}.")
    if log_ratio_clip is not None and log_ratio_clip <= 0:
        raise ValueError(f"log_ratio_clip must be > 0 or None (off), got {log_ratio_clip}.")
    log_ratio, metrics = bridge_log_ratio(path_scores, old_path_scores, correction=correction,
                                          detach_correction=detach_correction)
    adv = _broadcast_adv(advantages, mask)
    lr = log_ratio if log_ratio_clip is None else log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    lr_tok = lr[:, None].expand(mask.shape)
    tok, clipped, dual = token_surrogate(torch.exp(lr_tok), adv, clip_low=clip_low, clip_high=clip_high,
                                         dual_clip=dual_clip)
    loss = aggregate(tok, mask, agg)
    with torch.no_grad():
        metrics = {
            "clip_frac": aggregate(clipped.float(), mask),
            "dual_clip_frac": aggregate(dual.float(), mask),
            "ppo_kl": aggregate(torch.exp(-lr_tok) + lr_tok - 1.0, mask),
            **metrics,
        }
    return loss, metrics
