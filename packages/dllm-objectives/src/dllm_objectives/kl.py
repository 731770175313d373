"""KL penalty estimators (Schulman's k1/k2/k3; docs/algorithms.md#kl) and ESPO/EBPO sequence KL."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_choice, check_finite, check_same_shape

__all__ = ["KL_KINDS", "kl_penalty", "sequence_kl"]

# verl names on the right map to the canonical ones on the left.
_ALIASES = {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
KL_KINDS = tuple(sorted(_ALIASES))


def _estimate(delta: Tensor, kind: str, clamp: float | None) -> Tensor:
    """Element-wise estimator of ``delta = logp - ref_logp``."""
    check_choice("kl kind", kind, KL_KINDS)
    k = _ALIASES[kind]
    if k == "k1":
        return delta
    if k == "abs":
        return delta.abs()
    if k == "k2":
        return 0.5 * delta**2
    # k3 = exp(-d) + d - 1. Clamping d to [-20, 20] first keeps exp finite and changes nothing
    # once the [-clamp, clamp] clamp applies (k3 >= 10 already for d <= -3 or d >= 11).
    d = delta.clamp(-20.0, 20.0) if clamp is not None and clamp <= 10.0 else delta.clamp(-80.0, 80.0)
    k3 = torch.exp(-d) + d - 1.0
    return k3 if clamp is None else k3.clamp(-clamp, clamp)


def kl_penalty(
    logp: Tensor,
    ref_logp: Tensor,
    kind: str = "k3",
    *,
    clamp: float | None = 10.0,
    dare_advantages: Tensor | None = None,
) -> Tensor:
    """Element-wise KL estimator of ``KL(pi_theta || pi_ref)`` from sampled log-probs (docs/algorithms.md#kl).

    With ``d = logp - ref_logp``: ``k1 = d``, ``abs = |d|``, ``k2 = d^2 / 2``,
    ``k3 = exp(-d) + d - 1`` clamped to ``[-clamp, clamp]`` (verl ``low_var_kl``). Aliases:
    ``kl``, ``mse``, ``low_var_kl``. Never NaN or Inf for finite input.

    Args:
        logp: current log-probs, any shape.
        ref_logp: reference log-probs, same shape.
        kind: one of :data:`KL_KINDS`.
        clamp: clamp of ``k3`` (``None``: no clamp; ``d`` is still limited to ``[-80, 80]``).
        dare_advantages: parity switch for DARE's dLLM variant (docs/algorithms.md#quirk-dllm-kl): where the
            advantage (broadcastable to ``logp``) is positive, ``d`` is replaced by
            ``log(1 + d)``. DARE returns NaN for ``d <= -1``; here ``1 + d`` is floored at
            ``1e-6``, so the value stays finite. ``None`` (canonical) applies the estimator to ``d``.

    Returns:
        float32 tensor of the input shape.
    """
    check_same_shape(logp=logp, ref_logp=ref_logp)
    check_finite(clamp=clamp)
    delta = logp.float() - ref_logp.float()
    if dare_advantages is not None:
        linear = torch.log((1.0 + delta).clamp_min(1e-6))
        delta = torch.where(dare_advantages.float() > 0, linear, delta)
    return _estimate(delta, kind, clamp)


def sequence_kl(
    value: Tensor,
    ref_value: Tensor,
    kind: str = "k2",
    *,
    length: float | Tensor = 1.0,
    k1_grad_correction: bool = False,
) -> Tensor:
    """Sequence-level KL of ELBO values (ESPO: ``/ R``; EBPO: raw; docs/algorithms.md#espo, #ebpo).

    ``Delta = value - ref_value``; k2 ``Delta^2 / 2``, k3 ``exp(-Delta) + Delta - 1``
    (overflow-guarded, unclamped in value up to ``Delta = -80``), k1 ``Delta``, abs
    ``|Delta|``; divided by ``length``. With ``k1_grad_correction`` (official ESPO code) the
    k1 value is unchanged but the term ``(E - sg E)(sg E - E_ref)`` is added, so the gradient
    is ``(1 + Delta) grad E / length``.

    Args:
        value: ``[B]`` sequence ELBO of the current policy.
        ref_value: ``[B]`` of the reference policy on the same masks.
        kind: one of :data:`KL_KINDS`.
        length: divisor (ESPO: the padded response length ``R``).
        k1_grad_correction: ESPO's k1 gradient term (only with ``kind="k1"``).

    Returns:
        float32 ``[B]``; average and scale by the KL coefficient in the caller.
    """
    check_same_shape(value=value, ref_value=ref_value)
    v = value.float()
    delta = v - ref_value.float()
    out = _estimate(delta, kind, None)
    if k1_grad_correction:
        if _ALIASES.get(kind) != "k1":
            raise ValueError(f"k1_grad_correction=True needs kind='k1', got kind={kind!r}.")
        out = out + (v - v.detach()) * delta.detach()
    return out / length
