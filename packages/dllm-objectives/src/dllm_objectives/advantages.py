"""Group-relative advantages: GRPO, Dr.GRPO, RLOO (docs/algorithms.md#advantages) and sequence reductions."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice, check_finite, check_nonempty

__all__ = ["grpo_advantages", "rloo_advantages", "sequence_advantages", "group_mean"]

_SINGLETON = ("zero", "raw")


def _group_index(group_ids: Tensor, batch: int) -> tuple[Tensor, int]:
    """Dense group index ``[B]`` in ``0..G-1`` and the number of groups ``G``."""
    if group_ids.shape != (batch,):
        raise ValueError(
            f"group_ids must have shape [B] = [{batch}], got {tuple(group_ids.shape)}."
        )
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if batch else 0


def group_mean(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row group mean and group size of ``values`` ``[B, ...]`` (groups along dim 0).

    Returns:
        ``(mean, count)``, both broadcast back to the rows: ``[B, ...]`` and ``[B, 1...]``.
    """
    check_nonempty("values", values)
    index, g = _group_index(group_ids, values.shape[0])
    flat = values.float().reshape(values.shape[0], -1)
    sums = torch.zeros((g, flat.shape[1]), device=flat.device).index_add_(0, index, flat)
    count = torch.zeros((g,), device=flat.device).index_add_(0, index, torch.ones_like(flat[:, 0]))
    mean = (sums / count[:, None])[index].reshape(values.shape)
    shape = (values.shape[0],) + (1,) * (values.dim() - 1)
    return mean, count[index].reshape(shape)


def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
    singleton: str = "zero",
) -> Tensor:
    """GRPO advantages ``(r - mean_g) / (std_g + eps)`` (Shao et al. 2024, arXiv 2402.03300).

    ``norm_by_std=False`` is Dr.GRPO (``r - mean_g``). Groups are rows sharing a ``group_ids``
    value (a prompt uid). ``scores`` may be ``[B]`` or ``[B, K]`` (MDPO per-step scores: each
    column is normalised across the group separately).

    Singleton groups: with ``singleton="zero"`` (canonical) the group mean is the score itself,
    so the advantage is 0 (a lone sample carries no relative signal). ``singleton="raw"``
    reproduces verl (mean 0, std 1: the advantage is the raw score).

    Args:
        scores: float ``[B]`` or ``[B, K]`` outcome rewards.
        group_ids: integer ``[B]``.
        norm_by_std: divide by the group standard deviation plus ``eps``.
        eps: added to the standard deviation (>= 0). With ``eps=0`` a group whose scores are
            all equal (standard deviation 0) gets advantage 0, as it does for any ``eps > 0``.
        unbiased_std: ``N - 1`` denominator (``torch.std``, verl) or ``N``.
        singleton: ``"zero"`` or ``"raw"``.

    Returns:
        float32, same shape as ``scores``.
    """
    check_choice("singleton", singleton, _SINGLETON)
    check_nonempty("scores", scores)
    check_finite(eps=eps)
    if eps < 0:
        raise ValueError(f"eps must be >= 0 (it is added to a group's standard deviation), got {eps}.")
    x = scores.float()
    mean, count = group_mean(x, group_ids)
    centred = x - mean
    if norm_by_std:
        sq, _ = group_mean(centred**2, group_ids)
        dof = (count - 1).clamp_min(1) if unbiased_std else count
        std = (sq * count / dof).sqrt()
        scale = std + eps
        # an all-equal group: centred is exactly 0, and so is its advantage (0 / 0 when eps=0)
        centred = torch.where(scale > 0, centred / torch.where(scale > 0, scale, 1.0), 0.0)
    lone = (count == 1).expand_as(x)
    # verl: mean 0 and std 1 for singletons, i.e. r / (1 + eps) with std normalisation
    raw = x / (1.0 + eps) if norm_by_std else x
    fill = raw if singleton == "raw" else torch.zeros_like(x)
    return torch.where(lone, fill, centred)


def rloo_advantages(scores: Tensor, group_ids: Tensor, *, singleton: str = "zero") -> Tensor:
    """RLOO advantages ``r_i - mean_{k != i} r_k = n / (n - 1) (r_i - mean_g)`` (ESPO).

    Args:
        scores: float ``[B]``.
        group_ids: integer ``[B]``.
        singleton: ``"zero"`` (canonical: no leave-one-out baseline exists, advantage 0) or
            ``"raw"`` (verl: the advantage is the raw score).

    Returns:
        float32 ``[B]``.
    """
    check_choice("singleton", singleton, _SINGLETON)
    check_nonempty("scores", scores)
    x = scores.float()
    mean, count = group_mean(x, group_ids)
    loo = (x - mean) * count / (count - 1).clamp_min(1)
    fill = x if singleton == "raw" else torch.zeros_like(x)
    return torch.where(count == 1, fill, loo)


def sequence_advantages(token_advantages: Tensor, mask: Tensor) -> Tensor:
    """Masked mean of token advantages per sequence (ESPO, EBPO, SPG).

    Args:
        token_advantages: ``[B, R]``.
        mask: bool ``[B, R]``.

    Returns:
        float32 ``[B]`` (0 for rows without valid tokens).
    """
    m = mask.float()
    return (token_advantages.float() * m).sum(-1) / m.sum(-1).clamp_min(1)
