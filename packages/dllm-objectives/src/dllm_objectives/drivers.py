"""Model-in-the-loop drivers that take callables, so the library never imports a model.

ESPO/EBPO proxy backward (docs/algorithms.md#espo), BGPO constant-memory accumulation (#bgpo),
CJ-GRPO / JustGRPO step replay (docs/algorithms.md#cj-grpo, #justgrpo). Each driver calls ``.backward()`` and
returns the detached total loss; the caller owns the optimiser step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

__all__ = ["proxy_backward", "per_sample_backward", "step_replay"]


def proxy_backward(
    objective_fn: Callable[[Tensor], Tensor],
    value_fns: Sequence[Callable[[], Tensor]],
) -> Tensor:
    """Exact memory-saving backward of ``objective(mean_m value_m)`` (ESPO/EBPO protocol).

    (a) compute every ``value_m`` without grad and their mean ``v``; (b) evaluate the
    objective at a detached leaf ``v`` and take ``g = dL/dv``; (c) for each ``m`` recompute
    ``value_m`` with grad and backpropagate ``sum(g * value_m) / M``. Equal to autograd through
    the mean only if the forwards are deterministic (no dropout).

    Args:
        objective_fn: maps the mean sequence value ``[B]`` to a scalar loss (e.g. a
            :func:`sequence_clip_loss` closure with old values and advantages bound).
        value_fns: ``M`` callables, each running one forward and returning ``[B]`` values
            (e.g. the normalised ELBO of MC sample ``m``).

    Returns:
        The detached loss.
    """
    if not value_fns:
        raise ValueError("value_fns must hold at least one callable.")
    with torch.no_grad():
        mean = torch.stack([fn() for fn in value_fns]).mean(0)
    leaf = mean.detach().requires_grad_(True)
    loss = objective_fn(leaf)
    (grad,) = torch.autograd.grad(loss, leaf)
    for fn in value_fns:
        torch.autograd.backward((fn() * grad).sum().div(len(value_fns)))
    return loss.detach()


def per_sample_backward(loss_fns: Sequence[Callable[[], Tensor]], *, scale: float | None = None) -> Tensor:
    """Backpropagate ``scale * loss_i`` one sample at a time (BGPO constant memory).

    Args:
        loss_fns: callables each running one forward and returning a scalar loss
            (e.g. :func:`bgpo_policy_loss` of MC sample ``i``).
        scale: multiplier of every loss (default ``1 / len(loss_fns)``).

    Returns:
        The detached sum of the scaled losses.
    """
    if not loss_fns:
        raise ValueError("loss_fns must hold at least one callable.")
    s = 1.0 / len(loss_fns) if scale is None else scale
    total = torch.zeros(())
    for fn in loss_fns:
        loss = fn() * s
        torch.autograd.backward(loss)
        total = total + loss.detach().cpu()
    return total


def step_replay(step_loss_fn: Callable[[int], Tensor], num_steps: int) -> Tensor:
    """Replay ``K`` trajectory steps with one backward each (CJ-GRPO; JustGRPO position chunks).

    Args:
        step_loss_fn: ``k -> scalar`` loss of step (or chunk) ``k``, already weighted so that the
            sum over steps is the full loss (:func:`cj_token_weights`, token-mean with the full
            denominator for JustGRPO).
        num_steps: ``K``.

    Returns:
        The detached sum of the step losses.
    """
    return per_sample_backward([partial(step_loss_fn, k) for k in range(num_steps)], scale=1.0)
