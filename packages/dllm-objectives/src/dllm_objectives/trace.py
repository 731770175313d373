"""TraceRL: trajectory-aware policy loss and the diffusion value model's step-level returns.

Wang et al., "Revolutionizing Reinforcement Learning Framework for Diffusion Large Language
Models", arXiv 2509.06949 (code: Gen-Verse/dLLM-RL at 10b4fd1; docs/algorithms.md#tracerl).

A rollout's trajectory is a step map ``step_of`` ``[B, L]``: the denoising step at which each
position was committed (-1: not part of the trajectory, e.g. the prompt). TraceRL

1. merges every ``shrink`` consecutive distinct steps into one (`shrink_steps`; within each block
   for block models, over the whole response for masked models);
2. replays the merged steps in order (`replay_rounds`): round ``k`` masks the positions whose
   merged step is the ``k``-th or later and scores the ``k``-th (block models: every block at its
   own ``k``-th step in one row, "sliced" block training);
3. trains the scored tokens with a clipped ratio against the rollout policy and a k3 KL to it
   (`trace_policy_loss`);
4. with a value model, gives each token the step-level GAE advantage of its merged step
   (`outcome_token_rewards`, `trace_returns_and_advantages`) and trains the value head with a
   clipped squared error (`trace_value_loss`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, check_finite, check_range, check_same_shape

__all__ = [
    "TRACE_NORMALIZATIONS",
    "shrink_steps",
    "replay_rounds",
    "trace_group_filter",
    "trace_policy_loss",
    "outcome_token_rewards",
    "trace_returns_and_advantages",
    "trace_value_loss",
]

TRACE_NORMALIZATIONS = ("length", "tokens")
"""`trace_policy_loss` reductions: the block-model script's (per-row sums over the padded response
length, train/rl_sdar.py) and the masked-model script's (per-row token means, train/rl_llada.py)."""


def _segments(step_of: Tensor, block_ids: Tensor | None) -> Tensor:
    """Segment id of every position ``[B, L]``: the (row, block) it belongs to, unique over the batch."""
    blk = torch.zeros_like(step_of) if block_ids is None else block_ids.clamp_min(0).to(step_of.dtype)
    width = int(blk.max().item()) + 1
    rows = torch.arange(step_of.shape[0], device=step_of.device)[:, None]
    return rows * width + blk


def _dense_rank(step_of: Tensor, block_ids: Tensor | None) -> Tensor:
    """Rank of each position's step among the distinct steps of its segment (-1 off the trajectory)."""
    seg = _segments(step_of, block_ids)
    valid = step_of >= 0
    big = int(step_of.max().clamp_min(0).item()) + 1
    key = seg * big + step_of.clamp_min(0)
    uniq, inverse = torch.unique(key[valid], return_inverse=True)  # sorted: segment-major, then step
    first = torch.zeros(int(seg.max().item()) + 1, dtype=torch.long, device=step_of.device)
    useg = uniq // big
    # the first distinct key of each segment: its rank in `uniq` where the segment starts
    starts = torch.ones_like(useg, dtype=torch.bool)
    starts[1:] = useg[1:] != useg[:-1]
    pos = torch.arange(uniq.numel(), device=step_of.device)
    first[useg[starts]] = pos[starts]
    rank = torch.full_like(step_of, -1)
    rank[valid] = inverse - first[useg[inverse]]
    return rank


def shrink_steps(step_of: Tensor, shrink: int, *, block_ids: Tensor | None = None) -> Tensor:
    """Merge every ``shrink`` consecutive distinct steps of a segment into its last one.

    The distinct steps of each segment (a row's block for block models, its whole trajectory
    without ``block_ids``), sorted, are cut into groups of ``shrink``; every step maps to the last
    step of its group (dLLM-RL ``collapse_k_unique``, train/rl_sdar.py:219-231, applied per block at
    :516-522, and to the whole response in train/rl_llada.py:256-257).

    Args:
        step_of: long ``[B, L]`` step map (-1: off the trajectory, kept).
        shrink: steps merged into one (>= 1; 1 leaves the map unchanged).
        block_ids: optional long ``[B, L]`` block of each position.

    Returns:
        long ``[B, L]``: the merged step of each position.
    """
    if shrink < 1:
        raise ValueError(f"shrink must be >= 1 (distinct steps merged into one), got {shrink}.")
    if step_of.dim() != 2:
        raise ValueError(f"step_of must be [B, L], got shape {tuple(step_of.shape)}.")
    if block_ids is not None:
        check_same_shape(step_of=step_of, block_ids=block_ids)
    if shrink == 1 or not bool((step_of >= 0).any()):
        return step_of.clone()
    rank = _dense_rank(step_of, block_ids)
    seg = _segments(step_of, block_ids)
    valid = step_of >= 0
    n_seg = int(seg.max().item()) + 1
    # the number of distinct steps of each segment, and each rank's group's last rank
    count = torch.zeros(n_seg, dtype=torch.long, device=step_of.device)
    count.scatter_reduce_(0, seg[valid], rank[valid] + 1, reduce="amax")
    last = torch.minimum((rank // shrink + 1) * shrink - 1, count[seg] - 1)
    # the step that holds rank `last` in the segment (scatter each step to its (segment, rank) slot)
    width = int(count.max().item())
    table = torch.zeros(n_seg * width, dtype=step_of.dtype, device=step_of.device)
    table[(seg * width + rank)[valid]] = step_of[valid]
    merged = table[(seg * width + last.clamp_min(0))]
    return torch.where(valid, merged, step_of)


def replay_rounds(step_of: Tensor, *, block_ids: Tensor | None = None) -> Tensor:
    """Replay round of each position: the rank of its step among its segment's distinct steps.

    Round ``k`` is one training row: it masks positions of round ``>= k`` and scores round ``k``
    (`dllm_objectives.replay_plan` of this map). With ``block_ids`` every block is replayed at its
    own ``k``-th step in the same row (dLLM-RL ``one_round_vectorized``, train/rl_sdar.py:366-424:
    each round takes every block's smallest remaining step); without, the ``k``-th distinct step
    of the whole trajectory (train/rl_llada.py:261-288).

    Args:
        step_of: long ``[B, L]`` (merged) step map, -1 off the trajectory.
        block_ids: optional long ``[B, L]`` block of each position.

    Returns:
        long ``[B, L]``, -1 off the trajectory.
    """
    if step_of.dim() != 2:
        raise ValueError(f"step_of must be [B, L], got shape {tuple(step_of.shape)}.")
    if block_ids is not None:
        check_same_shape(step_of=step_of, block_ids=block_ids)
    if not bool((step_of >= 0).any()):
        return torch.full_like(step_of, -1)
    return _dense_rank(step_of, block_ids)


def trace_group_filter(scores: Tensor, group_ids: Tensor, *, low: float = 0.2, high: float = 0.8) -> Tensor:
    """[B] bool: samples of groups whose mean score lies in ``[low, high]``.

    dLLM-RL keeps a prompt's responses only when the share of correct ones is neither above 0.8
    nor below 0.2 (reward/rl_reward.py:112-114).
    """
    check_finite(low=low, high=high)
    if not low <= high:
        raise ValueError(f"low must be <= high, got low={low}, high={high}.")
    from .advantages import group_mean

    mean, _ = group_mean(scores.float(), group_ids)
    return (mean >= low) & (mean <= high)


def trace_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip: float = 0.2,
    kl_coef: float = 0.01,
    normalization: str = "length",
    length: int | None = None,
    num_rows: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """TraceRL's clipped policy loss with its k3 KL to the rollout policy, over training rows.

    Per token: ``s = min(rho A, clip(rho, 1 - eps, 1 + eps) A)`` with ``rho = exp(logp - old)``
    and ``k3 = exp(old - logp) - 1 + (logp - old)``. ``normalization="length"`` (block models,
    train/rl_sdar.py:731-756): the log-ratio is zeroed off the mask and clamped to [-10, 10], and
    each row's sums over masked tokens are divided by ``length`` (the padded response length);
    ``"tokens"`` (masked models, train/rl_llada.py:584-603): each row's surrogate is its masked
    token mean, its KL the masked token sum. Loss ``= -(sum_rows s_row) / N + kl_coef
    (sum_rows k3_row) / N`` with ``N = num_rows`` (the rows of the optimizer step).

    Args:
        logp, old_logp: ``[M, L]`` token log-probs of the current and rollout policy.
        advantages: ``[M, L]`` token advantages (value model) or ``[M, 1]`` / ``[M]`` row advantages.
        mask: bool ``[M, L]``, the tokens scored in each row (``p_mask``).
        clip: symmetric clip range ``eps`` of the ratio.
        kl_coef: weight ``beta`` of the k3 KL (0: off).
        normalization: ``"length"`` or ``"tokens"``.
        length: the divisor of ``"length"`` (default ``L``).
        num_rows: ``N`` (default ``M``).

    Returns:
        ``(loss, metrics)``.
    """
    check_choice("normalization", normalization, TRACE_NORMALIZATIONS)
    check_bool("mask", mask, 2)
    check_same_shape(logp=logp, old_logp=old_logp, mask=mask)
    check_finite(clip=clip, kl_coef=kl_coef)
    check_range("clip", clip, 0.0, 1.0)
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}.")
    adv = advantages.to(logp.dtype)
    adv = adv[:, None] if adv.dim() == 1 else adv
    n = float(num_rows if num_rows is not None else logp.shape[0])
    denom = float(length if length is not None else logp.shape[1])
    m = mask.to(logp.dtype)
    delta = logp - old_logp
    if normalization == "length":
        delta = torch.where(mask, delta, torch.zeros_like(delta))
        ratio = delta.clamp(-10.0, 10.0).exp()
    else:
        ratio = delta.exp()
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv) * m
    if normalization == "length":
        row_surrogate = surrogate.sum(-1) / denom
    else:
        row_surrogate = surrogate.sum(-1) / m.sum(-1).clamp_min(1)
    policy = -row_surrogate.sum() / n
    kl_tok = ((-delta).clamp(-10.0, 10.0) if normalization == "length" else -delta).exp() - 1.0 + delta
    row_kl = (kl_tok * m).sum(-1) / (denom if normalization == "length" else 1.0)
    kl = row_kl.sum() / n
    loss = policy + kl_coef * kl if kl_coef > 0 else policy
    with torch.no_grad():
        clipped = ((ratio < 1.0 - clip) | (ratio > 1.0 + clip)) & mask
        tokens = m.sum().clamp_min(1)
        metrics = {"policy_loss": policy.detach(), "kl": kl.detach(),
                   "clip_frac": clipped.to(logp.dtype).sum() / tokens}
    return loss, metrics


def outcome_token_rewards(step_of: Tensor, rewards: Tensor, mask: Tensor) -> Tensor:
    """[B, L] token rewards of an outcome reward: the row's reward on the tokens of its last step
    (in the rewards' floating dtype).

    dLLM-RL gives the sequence reward to the trainable tokens of the last trainable step and 0
    elsewhere (train/train_sdar_value.py:771-779).

    Args:
        step_of: long ``[B, L]`` merged (global) step map.
        rewards: ``[B]`` sequence rewards.
        mask: bool ``[B, L]`` trainable tokens.
    """
    check_bool("mask", mask, 2)
    check_same_shape(step_of=step_of, mask=mask)
    last = torch.where(mask, step_of, torch.full_like(step_of, -1)).max(-1, keepdim=True).values
    hit = mask & (step_of == last)
    r = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    return torch.where(hit, r[:, None].expand_as(hit), torch.zeros_like(hit, dtype=r.dtype))


def _step_means(rank: Tensor, x: Tensor, mask: Tensor, width: int) -> Tensor:
    """[B, S] mean of ``x`` over the masked tokens of each step rank."""
    idx = rank.clamp_min(0)
    total = torch.zeros(rank.shape[0], width, dtype=x.dtype, device=x.device)
    count = torch.zeros_like(total)
    total.scatter_add_(1, idx, torch.where(mask, x, torch.zeros_like(x)))
    count.scatter_add_(1, idx, mask.to(x.dtype))
    return total / count.clamp_min(1)


def trace_returns_and_advantages(
    step_of: Tensor,
    token_rewards: Tensor,
    old_values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Token returns and step-level GAE advantages along the trace (TraceRL's value baseline).

    The trace of a row is its distinct (merged, global) steps over trainable tokens in order,
    ``t = 0 .. S-1``; ``r*_t`` and ``V*_t`` are the token means of the rewards and old values at
    step ``t``; ``R*_t = r*_t + gamma R*_{t+1}``, ``delta_t = r*_t - V*_t + gamma V*_{t+1}``,
    ``A*_t = delta_t + gamma lam A*_{t+1}``. A token ``j`` of step ``t`` gets
    ``R_j = r_j + gamma R*_{t+1}`` and ``A_j = r_j - V_j + gamma V*_{t+1} + gamma lam A*_{t+1}``
    (train/train_sdar_value.py:804-846; terms past the last step are 0).

    Args:
        step_of: long ``[B, L]`` merged global step map (-1 off the trajectory).
        token_rewards: ``[B, L]`` (`outcome_token_rewards`, or process rewards).
        old_values: ``[B, L]`` value-model predictions at each token's scoring row.
        mask: bool ``[B, L]`` trainable tokens.
        gamma, lam: discount and GAE ``lambda`` in [0, 1].

    Returns:
        ``(returns, advantages)``, ``[B, L]``, 0 off the mask.
    """
    check_bool("mask", mask, 2)
    check_same_shape(step_of=step_of, token_rewards=token_rewards, old_values=old_values, mask=mask)
    check_finite(gamma=gamma, lam=lam)
    check_range("gamma", gamma, 0.0, 1.0)
    check_range("lam", lam, 0.0, 1.0)
    if bool((mask & (step_of < 0)).any()):
        raise ValueError("mask marks a token without a step (step_of < 0); train only tokens of the trajectory.")
    dtype = torch.promote_types(token_rewards.dtype, old_values.dtype)
    r, v = token_rewards.to(dtype), old_values.to(dtype)
    rank = replay_rounds(torch.where(mask, step_of, torch.full_like(step_of, -1)))
    width = int(rank.max().clamp_min(0).item()) + 1
    r_star, v_star = _step_means(rank, r, mask, width), _step_means(rank, v, mask, width)
    steps = (rank.max(-1).values + 1)[:, None]  # S of each row
    live = torch.arange(width, device=rank.device)[None] < steps
    zeros = torch.zeros_like(r_star)
    ret, adv = zeros.clone(), zeros.clone()
    ret_next, adv_next, v_next = zeros[:, 0], zeros[:, 0], zeros[:, 0]
    for t in range(width - 1, -1, -1):  # steps past a row's last have no tokens: r*, V*, R*, A* are 0 there
        ok = live[:, t]
        ret[:, t] = torch.where(ok, r_star[:, t] + gamma * ret_next, zeros[:, t])
        delta = r_star[:, t] - v_star[:, t] + gamma * v_next
        adv[:, t] = torch.where(ok, delta + gamma * lam * adv_next, zeros[:, t])
        ret_next, adv_next, v_next = ret[:, t], adv[:, t], v_star[:, t]

    def after(x: Tensor) -> Tensor:  # x at step t + 1 of each token's step t (0 past the row's last)
        padded = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)
        return padded.gather(1, rank.clamp_min(0) + 1)

    returns = r + gamma * after(ret)
    advantages = r - v + gamma * after(v_star) + gamma * lam * after(adv)
    return torch.where(mask, returns, torch.zeros_like(returns)), torch.where(mask, advantages, torch.zeros_like(advantages))


def trace_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float = 0.2,
    length: int | None = None,
    num_rows: int | None = None,
) -> Tensor:
    """TraceRL's clipped value loss over training rows (train/train_sdar_value.py:994-1005).

    ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)`` on the masked tokens
    (``V`` zeroed off the mask), each row's sum divided by ``length``, the rows' sum by ``N``.

    Args:
        values, old_values, returns: ``[M, L]`` current and old value predictions, return targets.
        mask: bool ``[M, L]`` tokens scored in each row.
        clip: the value clip ``eps`` (the script's ``training.eps``).
        length: the padded response length (default ``L``).
        num_rows: ``N`` (default ``M``).
    """
    check_bool("mask", mask, 2)
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    check_finite(clip=clip)
    if clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}.")
    v = torch.where(mask, values, torch.zeros_like(values))
    clipped = old_values + (v - old_values).clamp(-clip, clip)
    err = torch.maximum((v - returns) ** 2, (clipped - returns) ** 2)
    per_row = (0.5 * err * mask.to(values.dtype)).sum(-1) / float(length if length is not None else values.shape[1])
    return per_row.sum() / float(num_rows if num_rows is not None else values.shape[0])
