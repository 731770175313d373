"""Trajectory replay: CJ-GRPO step states and weights, JustGRPO AR states, MDPO step losses.

CJ-GRPO: Yang et al., arXiv 2509.23924. JustGRPO: Ni et al., arXiv 2601.15165. MDPO: He et al.,
arXiv 2508.13148 (docs/algorithms.md#cj-grpo, #justgrpo, #mdpo). A trajectory is a step map
``step_of`` ``[B, L]``: the (global or block-local) step at which each response position was
unmasked, -1 elsewhere. Step ``k`` replays the state where positions with step ``< k`` are
revealed and scores the positions with step ``== k``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, check_finite, check_same_shape
from .advantages import grpo_advantages
from .plan import MaskPlan
from .policy import token_surrogate

__all__ = [
    "unmask_steps",
    "autoregressive_steps",
    "replay_plan",
    "cj_token_weights",
    "mdpo_step_scores",
    "mdpo_step_advantages",
    "mdpo_topk_steps",
    "mdpo_loss",
]

_CJ_MODES = ("paper_exact", "step_token_mean")


def unmask_steps(trajectory: Tensor) -> Tensor:
    """Step map ``[B, L]`` from a binary rollout trajectory ``T`` ``[B, K, L]`` (-1 if never unmasked)."""
    if trajectory.dim() != 3:
        raise ValueError(f"trajectory must be [B, K, L], got shape {tuple(trajectory.shape)}.")
    hit = trajectory.bool()
    if bool((hit.long().sum(1) > 1).any()):
        raise ValueError("trajectory assigns a position to more than one step; each token is unmasked once.")
    step = hit.long().argmax(1)
    return torch.where(hit.any(1), step, torch.full_like(step, -1))


def autoregressive_steps(response_valid: Tensor) -> Tensor:
    """JustGRPO left-to-right order: step of valid response position = its rank."""
    check_bool("response_valid", response_valid, 2)
    rank = response_valid.long().cumsum(-1) - 1
    return torch.where(response_valid, rank, torch.full_like(rank, -1))


def replay_plan(step_of: Tensor, num_steps: int | None = None) -> MaskPlan:
    """Replay states as a plan: copy ``k`` masks positions with ``step >= k`` (``p_mask = 1``).

    ``meta["scored"]`` ``[B, K, L]`` marks the positions scored at step ``k`` (``step == k``).
    For block models pass block-local steps: the BD3LM noisy half of state ``k`` is this mask.

    Args:
        step_of: long ``[B, L]`` step map (-1: never masked, e.g. prompt and padding).
        num_steps: ``K`` (default ``step_of.max() + 1``).

    Returns:
        A plan with ``N = K``.
    """
    k = int(step_of.max().item()) + 1 if num_steps is None else num_steps
    steps = torch.arange(k, device=step_of.device)[None, :, None]
    s = step_of[:, None, :]
    mask = (s >= steps) & (s >= 0)
    scored = s == steps
    return MaskPlan(mask=mask, p_mask=mask.float(), meta={"scored": scored})


def cj_token_weights(
    step_of: Tensor,
    num_steps: int,
    *,
    block_ids: Tensor | None = None,
    mode: str = "paper_exact",
    num_sequences: int | None = None,
) -> Tensor:
    """CJ-GRPO token weights ``[B, K, L]``; the loss is ``sum(weights * loss_token)``.

    * ``"paper_exact"`` (Eq. 11; SDAR/LLaDA2 in DARE): token mean within each (sample, block,
      step) transition, mean over the sample's transitions, mean over ``num_sequences``
      samples (default ``B``; pass the mini-batch size for micro-batch invariance).
    * ``"step_token_mean"`` (LLaDA/Dream in DARE): token mean per step over the whole
      (micro-)batch, divided by ``num_steps``.

    Args:
        step_of: long ``[B, L]`` step map (global steps, or block-local with ``block_ids``).
        num_steps: ``K``.
        block_ids: optional long ``[B, L]``; transitions are (block, step) pairs.
        mode: ``"paper_exact"`` or ``"step_token_mean"``.
        num_sequences: the sample count of the paper-exact mean.

    Returns:
        float32 ``[B, K, L]``.
    """
    check_choice("mode", mode, _CJ_MODES)
    plan = replay_plan(step_of, num_steps)
    scored = plan.meta["scored"].float()  # [B, K, L]
    if mode == "step_token_mean":
        per_step = scored.sum((0, 2), keepdim=True).clamp_min(1)
        return scored / (per_step * num_steps)
    blk = torch.zeros_like(step_of) if block_ids is None else block_ids.clamp_min(0)
    check_same_shape(step_of=step_of, block_ids=blk)
    n_blk = int(blk.max().item()) + 1
    trans = torch.where(step_of >= 0, blk * num_steps + step_of.clamp_min(0), torch.zeros_like(blk))
    counts = torch.zeros((step_of.shape[0], n_blk * num_steps), device=step_of.device)
    counts.scatter_add_(1, trans, (step_of >= 0).float())
    n_trans = (counts > 0).float().sum(-1, keepdim=True).clamp_min(1)  # [B, 1]
    tok_count = counts.gather(1, trans).clamp_min(1)  # [B, L]
    w = 1.0 / (tok_count * n_trans * float(num_sequences or step_of.shape[0]))
    return scored * w[:, None, :]


def mdpo_step_scores(step_rewards: Tensor) -> Tensor:
    """MDPO step scores ``s_t = (r_t - r_{t-1} + 1) + c_t`` (docs/algorithms.md#mdpo).

    ``r_{-1} = 0``; ``c_t = mean_{s > t} r_s`` for ``t < T - 1`` and ``c_{T-1} = r_{T-1}``.

    Args:
        step_rewards: ``[B, T]`` rewards of the intermediate predictions.

    Returns:
        float32 ``[B, T]``.
    """
    r = step_rewards.float()
    prev = torch.cat([torch.zeros_like(r[:, :1]), r[:, :-1]], dim=1)
    t = r.shape[1]
    suffix = r.flip(1).cumsum(1).flip(1) - r  # sum_{s > t} r_s
    n_after = torch.arange(t - 1, -1, -1, device=r.device, dtype=torch.float32)
    future = torch.where(n_after > 0, suffix / n_after.clamp_min(1), r)
    return (r - prev + 1.0) + future


def mdpo_step_advantages(
    step_rewards: Tensor, group_ids: Tensor, *, norm_by_std: bool = True
) -> Tensor:
    """Per-step GRPO normalisation of :func:`mdpo_step_scores` across each group, ``[B, T]``."""
    return grpo_advantages(mdpo_step_scores(step_rewards), group_ids, norm_by_std=norm_by_std)


def mdpo_topk_steps(step_advantages: Tensor, k: int) -> Tensor:
    """The ``min(k, T)`` steps with the largest ``sum_batch |A_t|``, sorted ascending (long ``[k]``)."""
    importance = step_advantages.abs().sum(0)
    top = importance.topk(min(k, importance.shape[0])).indices
    return top.sort().values


def mdpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    confidence: Tensor,
    *,
    clip: float = 0.2,
    max_len: int | None = None,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """MDPO loss over (sample, selected step) rows (docs/algorithms.md#mdpo).

    ``lam = R / max(1, |m|)``; token ``max(-A r lam, -A clip(r) lam) + beta (l_ref - l)^2 / 2``;
    loss ``sum(tok m c) / sum(m)``. No dual clip.

    Args:
        logp, old_logp: ``[rows, R]`` log-probs of the step predictions given the step state.
        advantages: ``[rows]`` step advantages.
        mask: bool ``[rows, R]`` positions masked in the state.
        confidence: ``[rows, R]`` rollout confidence of the sampled token.
        clip: symmetric clip.
        max_len: ``R`` of ``lam`` (default ``logp.shape[-1]``).
        beta: k2 KL coefficient (needs ``ref_logp``).
        ref_logp: ``[rows, R]`` reference log-probs.

    Returns:
        ``(loss, metrics)`` with ``clip_frac``.
    """
    check_same_shape(logp=logp, old_logp=old_logp, mask=mask, confidence=confidence)
    check_finite(clip=clip, beta=beta)
    m = mask.float()
    lam = float(max_len or logp.shape[-1]) / m.sum(-1, keepdim=True).clamp_min(1)
    ratio = torch.exp(logp.float() - old_logp.float())
    adv = advantages.float()[:, None].expand_as(ratio)
    tok, clipped, _ = token_surrogate(ratio, adv * lam, clip_low=clip, clip_high=clip, dual_clip=None)
    if beta:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the reference per-token log-probs).")
        tok = tok + beta * 0.5 * (ref_logp.float() - logp.float()) ** 2
    loss = (tok * m * confidence.float()).sum() / m.sum().clamp_min(1)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped.float() * m).sum() / m.sum().clamp_min(1)}
    return loss, metrics
