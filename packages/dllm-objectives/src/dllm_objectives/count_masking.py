"""Count-based masking: stratified counts M3 (VRPO, BGPO) and ESPO counts M4 (docs/algorithms.md#masking).

A count plan first picks how many positions ``k`` to mask, then a uniformly random subset of
that size among the valid positions. ``p_mask = k / denominator`` is the marginal masking
probability of each valid position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_bool, check_choice, uniform, uniform64
from .masking import complement_plan
from .plan import MaskPlan

__all__ = ["count_masks", "espo_masks", "random_subset"]

_SUPPORTS = ("1..L", "0..L")
_DENOMINATORS = ("L", "L+1")
_STRATIFY = ("per_sequence", "across_batch", "none")


def random_subset(valid: Tensor, counts: Tensor, *, generator: torch.Generator) -> Tensor:
    """A uniformly random subset of ``counts[b, n]`` valid positions of row ``b``, per copy.

    Args:
        valid: bool ``[B, L]``.
        counts: integer ``[B, N]``, each in ``0..valid[b].sum()``.
        generator: source of randomness.

    Returns:
        bool ``[B, N, L]`` with exactly ``counts[b, n]`` True entries, all at valid positions.
    """
    b, n = counts.shape
    scores = uniform((b, n, valid.shape[-1]), generator, valid)
    scores = torch.where(valid[:, None, :], scores, torch.full_like(scores, 2.0))
    ranks = scores.argsort(dim=-1).argsort(dim=-1)
    return (ranks < counts[..., None]) & valid[:, None, :]


def _stratified(base: Tensor, offsets: Tensor, size: Tensor, low: int) -> Tensor:
    """Counts ``low + ((round(base + offset * size) - low) mod size)``.

    ``torch.round`` rounds ties to even, as in the reference; rounding before subtracting
    ``low`` keeps its tie behaviour (``round(k - 1 + 0.5) != round(k + 0.5) - 1``).
    """
    size64 = size.to(torch.float64).clamp_min(1)
    shifted = torch.round(base.to(torch.float64) + offsets * size64) - low
    return (low + torch.remainder(shifted, size64)).long()


def _draw_counts(
    lengths: Tensor, num_samples: int, low: int, stratify: str, generator: torch.Generator
) -> Tensor:
    """Counts ``[B, N]`` in ``low..L_b`` with the requested stratification."""
    b = lengths.shape[0]
    size = (lengths - low + 1).clamp_min(1)  # support size of every row
    if stratify == "across_batch" and bool((lengths == lengths[0]).all()):
        base = low + torch.floor(uniform64((1, num_samples), generator, lengths) * size[0]).long()
        offsets = torch.arange(b, device=lengths.device, dtype=torch.float64)[:, None] / b
        counts = _stratified(base, offsets, size[:, None], low)
    elif stratify == "per_sequence":
        base = low + torch.floor(uniform64((b, 1), generator, lengths) * size[:, None]).long()
        offsets = torch.arange(num_samples, device=lengths.device, dtype=torch.float64) / num_samples
        counts = _stratified(base, offsets[None, :], size[:, None], low)
    else:  # independent draws (ESPO falls back to this when row lengths differ)
        u = uniform64((b, num_samples), generator, lengths)
        counts = low + torch.floor(u * size[:, None]).long()
    return torch.minimum(counts, lengths[:, None]) * (lengths[:, None] > 0)


def count_masks(
    valid: Tensor,
    num_samples: int,
    *,
    support: str = "1..L",
    denominator: str = "L",
    stratify: str = "per_sequence",
    generator: torch.Generator,
) -> MaskPlan:
    """Stratified count masking M3 (VRPO arXiv 2505.19223, BGPO arXiv 2510.11683; docs/algorithms.md#masking).

    Default (M3): per row ``k ~ U{1..L_b}`` and the ``N`` copies use the equally spaced counts
    ``k_i = ((round(k + i * L_b / N) - 1) mod L_b) + 1``; each copy masks a uniformly random
    subset of ``k_i`` valid positions; ``p_mask = k_i / L_b``. With ``k ~ U{1..L}`` the ELBO is
    unbiased for exact conditionals (docs/algorithms.md#elbo). Rows with no valid position get no mask.

    Args:
        valid: bool ``[B, L]``; padding (False) is never masked.
        num_samples: ``N`` copies per row (``mc_num``).
        support: ``"1..L"`` (M3) or ``"0..L"`` (ESPO's M4, count 0 allowed).
        denominator: ``"L"`` (``p = k / L_b``) or ``"L+1"`` (ESPO: ``p = x / (L_b + 1)``).
        stratify: ``"per_sequence"`` (M3: copies of one row are spaced by ``size / N``),
            ``"across_batch"`` (M4: row ``b`` of sample ``n`` is spaced by ``size / B``; only when
            every row has the same ``L``, otherwise independent draws, as in the reference)
            or ``"none"`` (independent draws).
        generator: source of randomness.

    Returns:
        A plan with ``meta["counts"]`` and ``meta["denominator"]`` ``[B, N]``.
    """
    check_bool("valid", valid, 2)
    check_choice("support", support, _SUPPORTS)
    check_choice("denominator", denominator, _DENOMINATORS)
    check_choice("stratify", stratify, _STRATIFY)
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
    lengths = valid.sum(-1)
    counts = _draw_counts(lengths, num_samples, 1 if support == "1..L" else 0, stratify, generator)
    denom = (lengths + (1 if denominator == "L+1" else 0)).float()[:, None].expand(-1, num_samples)
    mask = random_subset(valid, counts, generator=generator)
    ratio = counts.float() / denom.clamp_min(1)
    p_mask = ratio[..., None] * valid[:, None, :].float()
    meta = {"counts": counts, "denominator": denom.contiguous()}
    return MaskPlan(mask=mask, p_mask=p_mask, meta=meta)


def espo_masks(
    valid: Tensor, num_samples: int, *, generator: torch.Generator
) -> tuple[MaskPlan, MaskPlan]:
    """ESPO masks M4 and their antithetic complements (Ou et al., arXiv 2512.03759; docs/algorithms.md#espo).

    Count ``x in 0..L`` stratified across the rows of the batch, ``p_mask = x / (L + 1)``; the
    complement masks the other ``L - x`` valid positions with ``p_mask = (L - x) / (L + 1)``.
    Average the two ELBOs with :func:`dllm_objectives.antithetic_elbo`.

    Args:
        valid: bool ``[B, L]``, valid response positions.
        num_samples: ``M`` (``mc_num``) per row; draw a fresh pair per ESPO iteration.
        generator: source of randomness.

    Returns:
        ``(plan, complement)``, both ``[B, M, L]``.
    """
    plan = count_masks(
        valid, num_samples, support="0..L", denominator="L+1", stratify="across_batch",
        generator=generator,
    )
    return plan, complement_plan(plan, valid)
