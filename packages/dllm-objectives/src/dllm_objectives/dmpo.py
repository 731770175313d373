"""DMPO: importance weights, weight baselines, WDCE and WDDO losses (docs/algorithms.md#dmpo).

Zhu et al., *Distribution Matching Policy Optimization*, arXiv 2510.08233. Target
``p*(o | q) ~ p_ref(o | q) exp(r / alpha)``; rollouts from the stop-gradient current model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_choice, check_finite, check_nonempty, check_same_shape
from .advantages import _group_index, group_mean

__all__ = [
    "group_softmax",
    "dmpo_weights",
    "dmpo_ess_coeff",
    "dmpo_baseline",
    "dmpo_sequence_elbo",
    "wdce_loss",
    "wddo_loss",
]

_BASELINES = ("none", "group", "individual", "model")


def group_softmax(logits: Tensor, group_ids: Tensor) -> Tensor:
    """Softmax of ``logits`` ``[B]`` within each group of ``group_ids`` ``[B]``."""
    index, g = _group_index(group_ids, logits.shape[0])
    x = logits.float()
    gmax = torch.full((g,), -math.inf, device=x.device).scatter_reduce(0, index, x, "amax")
    e = torch.exp(x - gmax[index])
    z = torch.zeros((g,), device=x.device).index_add_(0, index, e)
    return e / z[index]


def dmpo_weights(
    rewards: Tensor, log_rnd: Tensor, group_ids: Tensor, *, alpha: float, coeff: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Self-normalised DMPO weights ``w`` and ``w-`` within each prompt group.

    ``w = softmax_g(k (rho + r / alpha))`` and ``w- = softmax_g(k (rho - r / alpha))``.

    ``alpha = 0``: ``softmax(k r)`` / ``softmax(-k r)``; ``alpha = -1``: raw ``r`` / ``-r`` (the
    reference crashes there; this returns the intended values).

    Args:
        rewards: ``[B]``.
        log_rnd: ``[B]`` ``rho = log p_ref(o) - log p_behaviour(o)``.
        group_ids: ``[B]`` prompt groups.
        alpha: reward temperature.
        coeff: ``kappa`` in [0, 1] (:func:`dmpo_ess_coeff`).

    Returns:
        ``(w, w_neg)``, float32 ``[B]``; ``w`` sums to 1 per group when ``alpha >= 0``.
    """
    check_same_shape(rewards=rewards, log_rnd=log_rnd)
    check_nonempty("rewards", rewards)
    check_finite(alpha=alpha, coeff=coeff)
    r, rho = rewards.float(), log_rnd.float()
    if alpha == -1:
        return r, -r
    if alpha == 0:
        return group_softmax(coeff * r, group_ids), group_softmax(-coeff * r, group_ids)
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (or -1 for raw rewards), got {alpha}.")
    return (
        group_softmax(coeff * (rho + r / alpha), group_ids),
        group_softmax(coeff * (rho - r / alpha), group_ids),
    )


def _ess(logits: Tensor, coeff: float) -> float:
    w = torch.softmax(coeff * logits, dim=0)
    return float(1.0 / (logits.shape[0] * (w**2).sum()))


def dmpo_ess_coeff(
    log_rnd: Tensor,
    rewards: Tensor,
    *,
    alpha: float,
    ess_target: float,
    bounds: tuple[float, float] = (0.01, 0.99),
    iters: int = 60,
) -> float:
    """Adaptive ``kappa`` minimising ``(ess_target - ESS)^2`` on ``bounds`` (golden section).

    ``ESS = 1 / (n sum w^2)`` of ``w = softmax(kappa (rho + r / alpha))`` over the given
    samples (the reference uses the per-device slice). Deterministic, no SciPy.

    Returns:
        ``kappa`` as a float.
    """
    check_finite(alpha=alpha, ess_target=ess_target)
    x = log_rnd.float() + (rewards.float() / alpha if alpha > 0 else rewards.float())
    lo, hi = bounds
    g = (math.sqrt(5) - 1) / 2
    a, b = lo + (1 - g) * (hi - lo), lo + g * (hi - lo)
    fa, fb = (ess_target - _ess(x, a)) ** 2, (ess_target - _ess(x, b)) ** 2
    for _ in range(iters):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - g) * (hi - lo)
            fa = (ess_target - _ess(x, a)) ** 2
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = (ess_target - _ess(x, b)) ** 2
    return (lo + hi) / 2


def dmpo_baseline(
    weights: Tensor,
    group_ids: Tensor,
    *,
    kind: str = "group",
    strength: float = 1.0,
    neg_weights: Tensor | None = None,
    model_log_ratio: Tensor | None = None,
) -> Tensor:
    """Weight-baseline subtraction (``advantage_centering``; docs/algorithms.md#dmpo item 3).

    ``group``: ``w - s mean_g(w)``; ``individual``: ``w - s w-``; ``model``:
    ``w - s softmax_g(E_theta(o) - log p_behaviour(o))`` (detached); ``none``: ``w``.
    With ``s = 1`` and whole groups every variant sums to 0 per group. The reference takes the
    mean and the model softmax over each device slice: pass slice ids as ``group_ids`` for parity.

    Returns:
        float32 ``[B]``.
    """
    check_choice("kind", kind, _BASELINES)
    check_finite(strength=strength)
    w = weights.float()
    if kind == "none":
        return w
    if kind == "group":
        return w - strength * group_mean(w, group_ids)[0]
    if kind == "individual":
        if neg_weights is None:
            raise ValueError("kind='individual' needs neg_weights (w_neg from dmpo_weights).")
        return w - strength * neg_weights.float()
    if model_log_ratio is None:
        raise ValueError("kind='model' needs model_log_ratio (ELBO_theta - log p_behaviour, [B]).")
    return w - strength * group_softmax(model_log_ratio.detach(), group_ids)


def dmpo_sequence_elbo(token_logp: Tensor, mask: Tensor, valid: Tensor, *, reduce: str = "mean") -> Tensor:
    """``sum/mean_m (L / |S_m|) sum_{j in S_m} l_j`` over replicates (DMPO items 3, 5), ``[B]``.

    Args:
        token_logp: ``[B, M, L]``; mask: bool ``[B, M, L]``; valid: bool ``[B, L]`` completion positions.
        reduce: ``"mean"`` (model baseline) or ``"sum"`` (WDDO without ``ddo_indep_set``).
    """
    check_choice("reduce", reduce, ("mean", "sum"))
    m = mask.float()
    length = valid.float().sum(-1, keepdim=True)
    per = (token_logp.float() * m).sum(-1) * length / m.sum(-1).clamp_min(1)
    return per.mean(-1) if reduce == "mean" else per.sum(-1)


def wdce_loss(token_logp: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """Weighted denoising cross-entropy ``(1/M) sum_i sum_m w_i mean_{S_im} CE`` (DMPO item 4).

    Sum (not mean) over samples, ``|S|`` clamped at 1.

    Args:
        token_logp: ``[B, M, L]`` log-probs of the clean tokens on the ``M`` replicates.
        mask: bool ``[B, M, L]`` masked completion positions (:func:`iid_masks`, ``t`` in [0.1, 1)).
        weights: ``[B]`` (baselined) weights, treated as constants.

    Returns:
        float32 scalar.
    """
    check_same_shape(token_logp=token_logp, mask=mask)
    m = mask.float()
    ce = -(token_logp.float() * m).sum(-1) / m.sum(-1).clamp_min(1)  # [B, M]
    return (weights.detach().float()[:, None] * ce).sum() / mask.shape[1]


def wddo_loss(
    elbo_real: Tensor,
    logp_behaviour: Tensor,
    weights: Tensor,
    *,
    elbo_fake: Tensor | None = None,
    beta: float = 1.0,
    alpha: float = 1.0,
) -> Tensor:
    """WDDO loss ``-mean(w log sig(b g)) - a mean log sig(-b g')`` (DMPO item 5).

    ``g = E_real - log p_behaviour`` and ``g' = E_fake - log p_behaviour`` (``ddo_indep_set``:
    separate replicate halves; default ``elbo_fake = elbo_real``). Raw weights (no baseline).

    Returns:
        float32 scalar.
    """
    check_same_shape(elbo_real=elbo_real, logp_behaviour=logp_behaviour, weights=weights)
    check_finite(beta=beta, alpha=alpha)
    fake = elbo_real if elbo_fake is None else elbo_fake
    g_real = elbo_real.float() - logp_behaviour.float()
    g_fake = fake.float() - logp_behaviour.float()
    w = weights.detach().float()
    return -(w * F.logsigmoid(beta * g_real)).mean() - alpha * F.logsigmoid(-beta * g_fake).mean()
