"""Semi-deterministic Monte Carlo (SDMC) sequence ELBO of GDPO (Rojas et al., arXiv 2510.08554;
docs/algorithms.md#gdpo).

The ELBO of a masked diffusion model is an integral over the noise level,
``E(y) = int_0^1 (1 / t) E_{y_t} [sum_j 1[y_t^j = M] log p(y^j | y_t)] dt``. GDPO evaluates the
outer integral with a fixed quadrature rule (nodes ``t_k``, weights ``w_k``) and keeps Monte Carlo
only for the mask draw at each node: ``E ~ sum_k w_k (1 / t_k) sum_{j in S_k} log p(y^j | y_{S_k})``
with ``S_k`` a uniformly random set of ``floor(t_k L)`` of the ``L`` valid positions.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from ._checks import check_bool
from .count_masking import random_subset
from .likelihood import Normalizer, _apply_normalizer, elbo
from .plan import MaskPlan

__all__ = ["QUADRATURE_RULES", "quadrature_rule", "sdmc_masks", "quadrature_elbo"]

QUADRATURE_RULES = ("gauss-1", "gauss-2", "gauss-3", "gauss-4", "gauss-5", "simpson")
"""The rules of GDPO's code; ``gauss-N`` is accepted for any ``1 <= N <= 64``."""

_MAX_GAUSS = 64
# GDPO's Simpson rule: nodes 0.1, 0.5, 1 (0 is moved to 0.1, away from the 1/t pole), weights 1/6, 4/6, 1/6
_SIMPSON = ((0.1, 0.5, 1.0), (1 / 6, 4 / 6, 1 / 6))


_A4, _B4 = (3 / 7 - 2 / 7 * (6 / 5) ** 0.5) ** 0.5, (3 / 7 + 2 / 7 * (6 / 5) ** 0.5) ** 0.5
_A5, _B5 = (1 / 3) * (5 - 2 * (10 / 7) ** 0.5) ** 0.5, (1 / 3) * (5 + 2 * (10 / 7) ** 0.5) ** 0.5
_W4 = ((18 - 30**0.5) / 36, (18 + 30**0.5) / 36)
_W5 = ((322 - 13 * 70**0.5) / 900, (322 + 13 * 70**0.5) / 900, 128 / 225)
# closed forms on [-1, 1] (the values of GDPO's table, so the mask counts floor(t L) match it bit for bit)
_CLOSED: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {
    1: ((0.0,), (2.0,)),
    2: ((-(1 / 3**0.5), 1 / 3**0.5), (1.0, 1.0)),
    3: ((-((3 / 5) ** 0.5), 0.0, (3 / 5) ** 0.5), (5 / 9, 8 / 9, 5 / 9)),
    4: ((-_B4, -_A4, _A4, _B4), (_W4[0], _W4[1], _W4[1], _W4[0])),
    5: ((-_B5, -_A5, 0.0, _A5, _B5), (_W5[0], _W5[1], _W5[2], _W5[1], _W5[0])),
}


def _gauss_legendre(n: int) -> tuple[Tensor, Tensor]:
    """Gauss-Legendre nodes and weights on [-1, 1], float64, nodes ascending: closed forms up to 5
    points, else the eigenvalues of the Jacobi matrix (Golub and Welsch 1969)."""
    if n in _CLOSED:
        x, w = _CLOSED[n]
        return torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64)
    k = torch.arange(1, n, dtype=torch.float64)
    off = k / torch.sqrt(4 * k * k - 1)
    jacobi = torch.diag(off, 1) + torch.diag(off, -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    return nodes, 2 * vectors[0] ** 2


def quadrature_rule(rule: str) -> tuple[Tensor, Tensor]:
    """Nodes ``t_k`` in (0, 1] and weights ``w_k`` (summing to 1) of a rule on the unit interval.

    ``gauss-N``: N-point Gauss-Legendre mapped from [-1, 1] by ``t = (x + 1) / 2``, ``w = w_x / 2``
    (exact for polynomials of degree ``2N - 1``); ``simpson``: GDPO's ``(0.1, 0.5, 1)`` with
    ``(1/6, 4/6, 1/6)``.

    Args:
        rule: one of :data:`QUADRATURE_RULES` (or ``gauss-N``, ``N <= 64``).

    Returns:
        ``(t, w)``, float64 ``[K]`` each, ``t`` ascending.
    """
    if rule == "simpson":
        t, w = _SIMPSON
        return torch.tensor(t, dtype=torch.float64), torch.tensor(w, dtype=torch.float64)
    match = re.fullmatch(r"gauss-(\d+)", rule)
    if match is None or not 1 <= int(match.group(1)) <= _MAX_GAUSS:
        raise ValueError(f"unknown quadrature rule {rule!r}; valid: 'gauss-N' with 1 <= N <= {_MAX_GAUSS} "
                         f"(GDPO's scripts: 'gauss-3') or 'simpson'.")
    x, wx = _gauss_legendre(int(match.group(1)))
    return 0.5 * x + 0.5, 0.5 * wx


def sdmc_masks(valid: Tensor, *, rule: str = "gauss-3", mc_samples: int = 1,
               generator: torch.Generator) -> MaskPlan:
    """GDPO's masks: ``mc_samples`` draws at each node ``t_k`` of a quadrature rule (arXiv 2510.08554).

    Copy ``n = k * mc_samples + m`` masks a uniformly random set of ``floor(t_k * L_b)`` valid positions
    of row ``b`` (GDPO's ``int(p_mask * target_len)``, so a short row may mask none at a small node);
    ``p_mask = t_k`` (GDPO weighs each masked log-prob by ``1 / t_k``, not by ``L_b / count``).

    Args:
        valid: bool ``[B, L]``, positions that may be masked (the response).
        rule: quadrature rule (:func:`quadrature_rule`).
        mc_samples: mask draws per node (GDPO's ``mc_batch_size``, 1 in its scripts).
        generator: source of randomness.

    Returns:
        A plan with ``N = K * mc_samples`` copies and ``meta`` ``t``, ``weight`` (``w_k / mc_samples``)
        and ``counts``, each ``[B, N]``; :func:`quadrature_elbo` sums it.
    """
    check_bool("valid", valid, 2)
    if mc_samples < 1:
        raise ValueError(f"mc_samples must be >= 1, got {mc_samples}; GDPO's scripts use 1.")
    t, w = quadrature_rule(rule)
    b = valid.shape[0]
    t_n = t.repeat_interleave(mc_samples).to(valid.device)
    w_n = (w / mc_samples).repeat_interleave(mc_samples).to(valid.device)
    lengths = valid.sum(-1)
    counts = torch.floor(t_n[None, :] * lengths[:, None].to(torch.float64)).long()
    mask = random_subset(valid, torch.minimum(counts, lengths[:, None]), generator=generator)
    p_mask = t_n.float()[None, :, None] * valid[:, None, :].float()
    meta = {"t": t_n.float().expand(b, -1).contiguous(), "weight": w_n.float().expand(b, -1).contiguous(),
            "counts": counts}
    return MaskPlan(mask=mask, p_mask=p_mask, meta=meta)


def quadrature_elbo(token_logp: Tensor, plan: MaskPlan, *, normalizer: Normalizer = None) -> Tensor:
    """The SDMC sequence ELBO ``sum_n weight_n sum_{j in S_n} token_logp_nj / t_n`` (GDPO, arXiv 2510.08554).

    Args:
        token_logp: ``[B, N, L]`` log-probs of the clean tokens given each copy of ``plan``.
        plan: a :func:`sdmc_masks` plan (``meta["weight"]`` ``[B, N]``).
        normalizer: as in :func:`dllm_objectives.elbo` (GDPO: raw, ``None``).

    Returns:
        float32 ``[B]``.
    """
    if "weight" not in plan.meta:
        raise ValueError(f"plan.meta has no 'weight' (keys {sorted(plan.meta)}); build the plan with sdmc_masks.")
    weight = plan.meta["weight"]
    if weight.shape != plan.mask.shape[:2]:
        raise ValueError(f"plan.meta['weight'] must be [B, N] = {tuple(plan.mask.shape[:2])}, "
                         f"got {tuple(weight.shape)}.")
    value = (elbo(token_logp, plan) * weight.float()).sum(-1)
    return _apply_normalizer(value[:, None], normalizer, token_logp.shape[-1])[:, 0]

