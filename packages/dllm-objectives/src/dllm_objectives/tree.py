"""d-TreeRPO: tree values, sibling-local advantages, segment loss, self-distillation
(docs/algorithms.md#d-treerpo).

Pan et al., arXiv 2512.09675. A tree is given by ``parent`` ``[T]`` (-1 for roots) and leaf
rewards ``[T]`` (NaN on internal nodes).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_finite, check_same_shape
from .kl import kl_penalty
from .policy import clipped_policy_loss

__all__ = [
    "tree_values",
    "tree_local_advantages",
    "tree_active_positions",
    "tree_policy_loss",
    "tree_self_distill_schedule",
    "tree_self_distill_kl",
]


def tree_values(parent: Tensor, leaf_rewards: Tensor) -> Tensor:
    """Node values: leaf reward, internal value = nan-mean of its children (bottom-up).

    Args:
        parent: long ``[T]``, parent index of each node (-1 for roots).
        leaf_rewards: float ``[T]``, reward on leaves (NaN elsewhere).

    Returns:
        float32 ``[T]``.
    """
    check_same_shape(parent=parent, leaf_rewards=leaf_rewards)
    values = leaf_rewards.float().clone()
    p = parent.tolist()
    depth = [0] * len(p)
    for i in range(len(p)):  # trees are tiny (tens of nodes)
        j = i
        while p[j] >= 0:
            depth[i] += 1
            j = p[j]
    for d in range(max(depth, default=0), 0, -1):
        for node in (i for i in range(len(p)) if depth[i] == d - 1):
            kids = [c for c in range(len(p)) if p[c] == node]
            if kids:
                values[node] = torch.nanmean(values[kids])
    return values


def tree_local_advantages(parent: Tensor, values: Tensor) -> Tensor:
    """``A_n = v_n - mean{v_s : s sibling of n, s != n}`` (0 baseline without siblings; roots 0).

    Sibling advantages sum to 0 within every family.
    """
    check_same_shape(parent=parent, values=values)
    fam = torch.where(parent >= 0, parent, torch.full_like(parent, -1))
    n = parent.shape[0]
    same = (fam[:, None] == fam[None, :]) & (fam[:, None] >= 0)
    same = same & ~torch.eye(n, dtype=torch.bool, device=parent.device)
    v = values.float()
    n_sib = same.float().sum(-1)
    sib_mean = (same.float() * v[None, :]).sum(-1) / n_sib.clamp_min(1)
    adv = v - torch.where(n_sib > 0, sib_mean, torch.zeros_like(v))
    return torch.where(parent >= 0, adv, torch.zeros_like(v))


def tree_active_positions(
    parent_ids: Tensor,
    child_ids: Tensor,
    mask_id: int,
    eos_id: int,
    *,
    old_logp: Tensor | None = None,
) -> Tensor:
    """Active segment positions: parent masked, child unmasked, at or before the child's first EOS.

    ``old_logp`` reproduces the reference's extra ``logp != 0`` filter (docs/algorithms.md#quirk-treerpo:
    drops tokens predicted with probability 1 in float32); ``None`` (canonical) does not filter.

    Args:
        parent_ids, child_ids: long ``[S, R]`` response tokens of parent state and child.
        mask_id, eos_id: the model's mask and EOS ids.

    Returns:
        bool ``[S, R]``.
    """
    check_same_shape(parent_ids=parent_ids, child_ids=child_ids)
    is_eos = child_ids == eos_id
    before_eos = (is_eos.long().cumsum(-1) - is_eos.long()) == 0
    active = (parent_ids == mask_id) & (child_ids != mask_id) & before_eos
    return active if old_logp is None else active & (old_logp != 0)


def tree_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    active: Tensor,
    *,
    clip: float = 0.4,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Segment loss: ``seq-mean-token-mean`` clipped surrogate (no dual clip) + k3 KL.

    Args:
        logp, old_logp: ``[S, R]`` log-probs of the child tokens given the parent state.
        advantages: ``[S]`` local advantages (:func:`tree_local_advantages`).
        active: bool ``[S, R]``.
        clip: symmetric clip (0.4).
        ref_logp: ``[S, R]`` reference log-probs (needed when ``kl_coef > 0``).
        kl_coef: KL coefficient (0.01 in the recipe).

    Returns:
        ``(loss, metrics)`` with ``pg_loss``, ``kl`` and the surrogate metrics.
    """
    check_finite(kl_coef=kl_coef)
    pg, metrics = clipped_policy_loss(
        logp, old_logp, advantages, active, clip_low=clip, clip_high=clip, dual_clip=None,
        agg="seq-mean-token-mean",
    )
    loss = pg
    metrics = dict(metrics, pg_loss=pg.detach())
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp.")
        kl_tok = kl_penalty(logp, ref_logp, "k3")
        m = active.float()
        kl = ((kl_tok * m).sum(-1) / m.sum(-1).clamp_min(1)).mean()
        loss = loss + kl_coef * kl
        metrics["kl"] = kl.detach()
    return loss, metrics


def tree_self_distill_schedule(
    progress: float, *, lambda_max: float = 3e-3, gamma: float = 2.0, tau_max: float = 2.0, beta: float = 0.7
) -> tuple[float, float]:
    """Self-distillation schedule: ``lambda(phi)`` and ``tau(phi)`` (docs/algorithms.md#d-treerpo).

    ``lambda = lambda_max (e^{gamma phi} - 1) / (e^gamma - 1)``,
    ``tau = max(tau_max (1 - phi)^beta, 1e-6)``.

    Args:
        progress: ``phi = min(1, step / max_steps)`` (clipped to [0, 1]).

    Returns:
        ``(lambda, tau)``.
    """
    check_finite(progress=progress, lambda_max=lambda_max, gamma=gamma, tau_max=tau_max, beta=beta)
    phi = min(max(progress, 0.0), 1.0)
    lam = lambda_max * (math.exp(gamma * phi) - 1.0) / (math.exp(gamma) - 1.0)
    tau = max(tau_max * (1.0 - phi) ** beta, 1e-6)
    return lam, tau


def tree_self_distill_kl(
    parent_logp: Tensor,
    member_tokens: Tensor,
    member_advantages: Tensor,
    member_active: Tensor,
    *,
    tau: float,
) -> tuple[Tensor, Tensor]:
    """Per-position ``KL(q_j || p_theta(. | z_parent))`` for sibling groups (docs/algorithms.md#d-treerpo).

    Members with ``A > 0`` are kept, weighted by ``softmax(A / tau)``; ``q_j`` is the weighted
    empirical distribution of the kept members' tokens at ``j`` (members active at ``j``),
    and the KL runs over ``q_j``'s support with ``+1e-8`` inside ``log q``. Multiply the
    pooled mean by ``lambda`` of :func:`tree_self_distill_schedule`.

    Args:
        parent_logp: ``[G, R, V]`` log-softmax of the model at each group's parent state.
        member_tokens: long ``[G, M, R]`` child tokens (pad members with ``active`` False).
        member_advantages: ``[G, M]``.
        member_active: bool ``[G, M, R]``.
        tau: softmax temperature.

    Returns:
        ``(kl, used)``: float32 ``[G, R]`` and bool ``[G, R]``; the loss term is
        ``lambda * kl[used].mean()`` (0 when nothing is used).
    """
    check_finite(tau=tau)
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}.")
    keep = (member_advantages > 0)[..., None] & member_active  # [G, M, R]
    scaled = (member_advantages.float() / tau)[..., None].expand(keep.shape)
    logits = torch.where(keep, scaled, torch.full_like(scaled, -math.inf))
    w = torch.softmax(logits, dim=1).nan_to_num(0.0)  # [G, M, R], renormalised per position
    q = torch.zeros(parent_logp.shape, dtype=torch.float32, device=parent_logp.device)
    q.scatter_add_(2, member_tokens.transpose(1, 2), w.transpose(1, 2))  # [G, R, V]
    support = q > 0
    kl_terms = torch.where(support, q * (torch.log(q + 1e-8) - parent_logp.float()), torch.zeros_like(q))
    used = keep.any(1)
    return kl_terms.sum(-1) * used.float(), used
