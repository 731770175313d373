"""SPG: sandwiched policy gradient with ELBO/EUBO bounds (Wang et al., arXiv 2510.09541).

The estimators and the loss are summarised in docs/algorithms.md#spg.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, check_finite, check_range, check_same_shape, uniform
from .plan import MaskPlan

__all__ = ["spg_block_masks", "spg_sequence_logp", "spg_loss"]

_NEGATIVE = ("mix", "eubo", "elbo", "zero")


def _spg_block_choice(
    n_valid_blocks: Tensor, n_blocks: int, num_samples: int, generator: torch.Generator
) -> Tensor:
    """Block index ``[B, N]``: a random permutation of all blocks, reduced mod the valid count."""
    b = n_valid_blocks.shape[0]
    perm = uniform((b, n_blocks), generator, n_valid_blocks).argsort(-1)
    reps = math.ceil(num_samples / n_blocks)
    perm = perm.repeat(1, reps)[:, :num_samples]
    return torch.remainder(perm, n_valid_blocks[:, None].clamp_min(1))


def _partial_block(
    lam: Tensor, in_block: Tensor, t_min: float, t_max: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Counts ``k ~ U{max(floor(lam t_min), 1)..min(floor(lam t_max), lam)}`` and their positions."""
    lo = torch.floor(lam * t_min).long().clamp_min(1)
    hi = torch.minimum(torch.floor(lam * t_max).long(), lam)
    u = uniform(lam.shape, generator, lam)
    counts = torch.minimum(lo + torch.floor(u * (hi - lo + 1).clamp_min(1)).long(), lam)
    u_pos = uniform(in_block.shape, generator, lam)
    score = torch.where(in_block, u_pos, torch.full_like(u_pos, 2.0))
    return counts, in_block & (score.argsort(-1).argsort(-1) < counts[..., None])


def spg_block_masks(
    prompt_valid: Tensor,
    response_valid: Tensor,
    num_samples: int,
    *,
    response_start: int,
    block_length: int = 32,
    t_min: float = 0.0,
    t_max: float = 1.0,
    prompt_mask_prob: float = 0.15,
    generator: torch.Generator,
) -> MaskPlan:
    """SPG block masking M5 (``block_random`` of the SPG trainer; docs/algorithms.md#spg).

    Response blocks are aligned to ``response_start``. Per copy a block ``beta`` is chosen (a
    random permutation of all blocks reduced modulo the number of blocks covering the valid
    response; non-uniform when that number does not divide the total, as in the original);
    later blocks and response padding are fully masked (``p = 1``); block ``beta`` of valid
    length ``lam`` gets ``k ~ U{max(floor(lam t_min), 1)..min(floor(lam t_max), lam)}``
    uniformly placed masks (``p = k / lam``); the prompt and the earlier (clean) blocks are
    masked iid with ``prompt_mask_prob``. More copies than blocks reuse the permutation.

    Args:
        prompt_valid: bool ``[B, S]``.
        response_valid: bool ``[B, S]``, right-padded response starting at ``response_start``.
        num_samples: ``N`` (``num_t``).
        response_start: column of the first response position (the padded prompt length).
        block_length: rollout block length.
        t_min, t_max: range of the in-block ratio.
        prompt_mask_prob: iid rate for prompt and earlier blocks.
        generator: source of randomness.

    Returns:
        A plan with ``meta["block_index"]`` and ``meta["counts"]`` ``[B, N]``.
    """
    check_bool("prompt_valid", prompt_valid, 2)
    check_bool("response_valid", response_valid, 2)
    check_same_shape(prompt_valid=prompt_valid, response_valid=response_valid)
    check_range("prompt_mask_prob", prompt_mask_prob, 0.0, 1.0)
    b, s = response_valid.shape
    if not 0 <= response_start < s or block_length < 1:
        raise ValueError(
            f"need 0 <= response_start < {s} and block_length >= 1, "
            f"got response_start={response_start}, block_length={block_length}."
        )
    col = torch.arange(s, device=response_valid.device)
    in_resp = col >= response_start
    rel = (col - response_start).clamp_min(0)
    blk = torch.where(in_resp, torch.div(rel, block_length, rounding_mode="floor"), torch.full_like(col, -1))
    lengths = response_valid.long().sum(-1)
    n_valid = torch.div(lengths + block_length - 1, block_length, rounding_mode="floor")
    n_blocks = math.ceil((s - response_start) / block_length)
    beta = _spg_block_choice(n_valid, n_blocks, num_samples, generator)  # [B, N]
    lam = (lengths[:, None] - beta * block_length).clamp(0, block_length)
    in_block = response_valid[:, None, :] & (blk[None, None, :] == beta[..., None])
    counts, chosen = _partial_block(lam, in_block, t_min, t_max, generator)
    later = in_resp[None, None, :] & (blk[None, None, :] > beta[..., None])
    later = later | (in_resp[None, None, :] & ~response_valid[:, None, :])
    earlier = response_valid[:, None, :] & (blk[None, None, :] < beta[..., None])
    clean = prompt_valid[:, None, :] | earlier
    noisy_clean = clean & (uniform((b, num_samples, s), generator, lam) < prompt_mask_prob)
    mask = chosen | later | noisy_clean
    ratio = counts.float() / lam.clamp_min(1).float()
    rest = torch.where(later, torch.ones_like(ratio[..., None]), prompt_mask_prob * clean.float())
    p_mask = torch.where(in_block, ratio[..., None], rest)
    return MaskPlan(mask=mask, p_mask=p_mask, meta={"block_index": beta, "counts": counts})


def spg_sequence_logp(
    token_logp: Tensor,
    plan: MaskPlan,
    response_valid: Tensor,
    positive: Tensor,
    *,
    negative: str = "mix",
    eubo_beta: float = 1.5,
    mix_weight: float = 0.5,
) -> Tensor:
    """SPG sequence log-likelihood surrogate: ELBO for ``A > 0``, EUBO/mixture otherwise.

    With ``S_n`` the masked valid response positions of copy ``n`` and ``t_n = |S_n| / L``:
    ELBO ``l+ = mean_n mean_{j in S_n} l_nj``; EUBO ``(1 / beta) mean_{j in J} log a_j`` with
    ``a_j = mean_n [j in S_n] p_nj^beta / t_n`` and ``J = {a_j > 0}``; mixture
    ``w EUBO + (1 - w) l+``. For one copy ``l+ <= mix <= EUBO``.

    Args:
        token_logp: ``[B, N, S]``.
        plan: the :func:`spg_block_masks` plan.
        response_valid: bool ``[B, S]``.
        positive: bool ``[B]``, sequences whose advantage is positive (get ``l+``).
        negative: estimator for the others: ``"mix"``, ``"eubo"``, ``"elbo"`` or ``"zero"``.
        eubo_beta: ``beta_E`` (1.5).
        mix_weight: ``w`` (0.5).

    Returns:
        float32 ``[B]``.
    """
    check_choice("negative", negative, _NEGATIVE)
    check_same_shape(token_logp=token_logp, mask=plan.mask)
    check_finite(eubo_beta=eubo_beta, mix_weight=mix_weight)
    if eubo_beta <= 0:
        raise ValueError(f"eubo_beta must be > 0, got {eubo_beta}.")
    lp = token_logp.float()
    sel = plan.mask & response_valid[:, None, :]
    n_sel = sel.float().sum(-1)  # [B, N]
    zeros = torch.zeros_like(lp)
    lower = (torch.where(sel, lp, zeros).sum(-1) / n_sel.clamp_min(1)).mean(-1)
    length = response_valid.float().sum(-1, keepdim=True).clamp_min(1)
    log_t = torch.log((n_sel / length).clamp_min(1e-12))
    terms = torch.where(sel, eubo_beta * lp - log_t[..., None], torch.full_like(lp, -math.inf))
    log_a = torch.logsumexp(terms, dim=1) - math.log(lp.shape[1])  # [B, S]
    hit = sel.any(1)
    upper = torch.where(hit, log_a, torch.zeros_like(log_a)).sum(-1) / hit.float().sum(-1).clamp_min(1)
    upper = upper / eubo_beta
    neg = {"mix": mix_weight * upper + (1 - mix_weight) * lower, "eubo": upper,
           "elbo": lower, "zero": torch.zeros_like(lower)}[negative]
    return torch.where(positive, lower, neg)


def spg_loss(seq_logp: Tensor, advantages: Tensor, lengths: Tensor) -> Tensor:
    """SPG REINFORCE loss ``sum_i(-A_i l_i L_i) / sum_i L_i`` (no ratio, no clip).

    Args:
        seq_logp: ``[B]`` from :func:`spg_sequence_logp`.
        advantages: ``[B]`` sequence advantages (:func:`sequence_advantages`).
        lengths: ``[B]`` valid response lengths ``L_i``.

    Returns:
        float32 scalar.
    """
    check_same_shape(seq_logp=seq_logp, advantages=advantages, lengths=lengths)
    w = lengths.float()
    return (-advantages.float() * seq_logp.float() * w).sum() / w.sum().clamp_min(1)
