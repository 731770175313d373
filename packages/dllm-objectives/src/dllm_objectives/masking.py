"""Bernoulli-type masking schemes: d1 one-step (M1), Coupled-GRPO (M2), iid-t (M7), complements.

Every sampler takes an explicit ``torch.Generator`` and never touches the global RNG. The
returned :class:`MaskPlan` is reused for the old, reference and current passes (docs/algorithms.md#notation).
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from ._checks import check_bool, check_range, check_same_shape, uniform
from .plan import MaskPlan

__all__ = ["one_step_masks", "coupled_masks", "iid_masks", "complement_plan"]


def one_step_masks(
    prompt_valid: Tensor,
    response_valid: Tensor,
    *,
    prompt_mask_prob: float = 0.15,
    generator: torch.Generator,
) -> MaskPlan:
    """d1 one-step masking M1 (Zhao et al. 2025, arXiv 2504.12216; docs/algorithms.md#d1).

    Every valid response position is masked; every valid prompt position is masked
    independently with probability ``prompt_mask_prob``. Padding is never masked.

    Args:
        prompt_valid: bool ``[B, L]``, valid prompt positions of the whole row.
        response_valid: bool ``[B, L]``, valid response positions of the same row.
        prompt_mask_prob: probability of masking each valid prompt token (d1: 0.15).
        generator: source of randomness.

    Returns:
        A plan with ``N = 1``; ``p_mask`` is 1 on the response and ``prompt_mask_prob`` on the
        prompt.
    """
    check_bool("prompt_valid", prompt_valid, 2)
    check_bool("response_valid", response_valid, 2)
    check_same_shape(prompt_valid=prompt_valid, response_valid=response_valid)
    check_range("prompt_mask_prob", prompt_mask_prob, 0.0, 1.0)
    if bool((prompt_valid & response_valid).any()):
        raise ValueError("prompt_valid and response_valid overlap; a position is either prompt or response.")
    u = uniform(prompt_valid.shape, generator, prompt_valid)
    mask = response_valid | (prompt_valid & (u < prompt_mask_prob))
    p_mask = response_valid.float() + prompt_valid.float() * prompt_mask_prob
    return MaskPlan(mask=mask.unsqueeze(1), p_mask=p_mask.unsqueeze(1))


def _coupled_draws(
    valid: Tensor, t_min: float, t_max: float, generator: torch.Generator, fixed_seed: int | None
) -> tuple[Tensor, Tensor]:
    """Mask ratio ``t`` ``[B]`` and uniforms ``u`` ``[B, L]`` for :func:`coupled_masks`."""
    b, length = valid.shape
    if fixed_seed is None:
        t = t_min + (t_max - t_min) * uniform((b,), generator, valid)
        return t, uniform((b, length), generator, valid)
    # DARE parity (docs/algorithms.md#quirk-coupled-seed): `set_seed(42)` before every call,
    # `random.uniform` for t and `torch.rand` for u, so all rows and all steps share one t and one u vector.
    t_val = random.Random(fixed_seed).uniform(t_min, t_max)
    cpu = torch.Generator().manual_seed(fixed_seed)
    u_row = torch.rand((length,), generator=cpu).to(valid.device)
    t = torch.full((b,), t_val, dtype=torch.float32, device=valid.device)
    return t, u_row.unsqueeze(0).expand(b, length)


def coupled_masks(
    valid: Tensor,
    *,
    t_min: float = 0.2,
    t_max: float = 0.8,
    include_full: bool = False,
    fixed_seed: int | None = None,
    generator: torch.Generator,
) -> MaskPlan:
    """Coupled complementary masks M2 of Coupled-GRPO (DiffuCoder, arXiv 2506.20639;
    docs/algorithms.md#coupled-grpo).

    Per row ``t ~ U[t_min, t_max]`` and ``u_j ~ U[0, 1)``: copy ``a`` masks valid positions with
    ``u_j < t`` (``p_mask = t``), copy ``b`` masks the other valid positions (``p_mask = 1 - t``),
    so the two copies partition the valid positions exactly.

    Args:
        valid: bool ``[B, L]``, positions that may be masked (the valid response).
        t_min, t_max: range of the mask ratio.
        include_full: prepend DiffuCoder's copy 0 that masks every valid position
            (``p_mask = 1``), giving ``N = 3``.
        fixed_seed: DARE parity switch (docs/algorithms.md#quirk-coupled-seed).
            ``None`` (canonical) draws from
            ``generator``; ``42`` reproduces DARE: ``t = random.Random(42).uniform(t_min, t_max)``
            (about 0.5837) and one ``u`` row from a CPU ``torch.Generator`` seeded 42, shared by
            every row and every call (DARE drew ``u`` on the training device, so only CPU
            streams match bit for bit). The global RNGs are never touched.
        generator: source of randomness (unused when ``fixed_seed`` is set).

    Returns:
        A plan with ``N = 2`` (or 3), ``meta["t"]`` ``[B, N]`` holding the per-copy mask ratio.
    """
    check_bool("valid", valid, 2)
    check_range("t_min", t_min, 0.0, 1.0)
    check_range("t_max", t_max, t_min, 1.0)
    t, u = _coupled_draws(valid, t_min, t_max, generator, fixed_seed)
    mask_a = valid & (u < t[:, None])
    mask_b = valid & ~mask_a
    ones = torch.ones_like(t)
    masks = [mask_a, mask_b]
    ratios = [t, 1.0 - t]
    if include_full:
        masks.insert(0, valid)
        ratios.insert(0, ones)
    mask = torch.stack(masks, dim=1)
    ratio = torch.stack(ratios, dim=1)
    p_mask = ratio[:, :, None] * valid[:, None, :].float()
    return MaskPlan(mask=mask, p_mask=p_mask, meta={"t": ratio})


def iid_masks(
    valid: Tensor,
    num_samples: int,
    *,
    t_min: float = 0.0,
    t_max: float = 1.0,
    eps: float = 0.0,
    antithetic: bool = False,
    generator: torch.Generator,
) -> MaskPlan:
    """IID Bernoulli-t masking M7 (LLaDA SFT, Dream SFT, DMPO; docs/algorithms.md#masking).

    Per (row, sample) ``t = max(t_raw, eps)`` with ``t_raw ~ U[t_min, t_max]``, then every valid
    position is masked independently with probability ``t``. LLaDA/SDAR SFT's
    ``t = (1 - 1e-3) u + 1e-3`` is exactly ``t_min=1e-3`` (same values for the same ``u``);
    Dream uses ``t_min=0`` (unbounded ``1 / t``); ``eps`` only guards against tiny ``t``.
    With ``t ~ U(0, 1)`` the ELBO of :func:`dllm_objectives.elbo` is unbiased for exact
    conditionals (docs/algorithms.md#elbo).

    Args:
        valid: bool ``[B, L]``, positions that may be masked.
        num_samples: ``N`` copies per row.
        t_min, t_max: range of ``t_raw`` (LLaDA2 SFT: 0.3, 0.8; DMPO: 0.1, 1.0).
        eps: floor of ``t``.
        antithetic: DMPO ``loss_antithetic``: copies come in pairs sharing ``t``; the second
            masks exactly the valid positions the first left visible (``p_mask = 1 - t``).
            Requires an even ``num_samples``.
        generator: source of randomness.

    Returns:
        A plan with ``meta["t"]`` ``[B, N]`` (the per-copy masking probability).
    """
    check_bool("valid", valid, 2)
    check_range("t_min", t_min, 0.0, 1.0)
    check_range("t_max", t_max, t_min, 1.0)
    check_range("eps", eps, 0.0, 1.0)
    if num_samples < 1 or (antithetic and num_samples % 2):
        raise ValueError(
            f"num_samples must be >= 1 (and even when antithetic=True), got {num_samples}."
        )
    b, length = valid.shape
    n_draw = num_samples // 2 if antithetic else num_samples
    t_raw = t_min + (t_max - t_min) * uniform((b, n_draw), generator, valid)
    t = t_raw.clamp_min(eps)
    mask = valid[:, None, :] & (uniform((b, n_draw, length), generator, valid) < t[..., None])
    if antithetic:
        comp = valid[:, None, :] & ~mask
        mask = torch.stack([mask, comp], dim=2).reshape(b, num_samples, length)
        t = torch.stack([t, 1.0 - t], dim=2).reshape(b, num_samples)
    p_mask = t[..., None] * valid[:, None, :].float()
    return MaskPlan(mask=mask, p_mask=p_mask, meta={"t": t})


def complement_plan(plan: MaskPlan, valid: Tensor) -> MaskPlan:
    """The antithetic complement of a plan over the valid positions (ESPO, docs/algorithms.md#espo).

    For count plans (``meta`` has ``counts`` and ``denominator``, e.g. ESPO's
    ``x / (L + 1)``) the complement masks ``L - x`` positions with
    ``p_mask = (L - x) / denominator``; for ratio plans (``meta["t"]``) ``p_mask = 1 - t``.

    Args:
        plan: the plan to complement.
        valid: bool ``[B, L]``, the positions the plan was drawn over.

    Returns:
        A plan masking ``valid & ~plan.mask`` with the complementary marginal probabilities.
    """
    check_bool("valid", valid, 2)
    mask = valid[:, None, :] & ~plan.mask
    if "counts" in plan.meta and "denominator" in plan.meta:
        lengths = valid.sum(-1, keepdim=True).to(plan.meta["counts"].dtype)
        counts = lengths - plan.meta["counts"]
        ratio = counts.float() / plan.meta["denominator"].clamp_min(1)
        meta = {"counts": counts, "denominator": plan.meta["denominator"]}
    elif "t" in plan.meta:
        ratio = 1.0 - plan.meta["t"]
        meta = {"t": ratio}
    else:
        raise ValueError(
            "plan.meta must hold 'counts' and 'denominator' (count plans) or 't' (ratio plans) "
            f"to build a complement; got keys {sorted(plan.meta)}."
        )
    p_mask = ratio[..., None] * valid[:, None, :].float()
    return MaskPlan(mask=mask, p_mask=p_mask, meta=meta)
