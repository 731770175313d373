"""Internal argument checks shared by the public functions (not part of the API)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def check_bool(name: str, x: Tensor, ndim: int) -> None:
    """Raise ValueError unless ``x`` is a bool tensor with ``ndim`` dimensions."""
    if x.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, got dtype {x.dtype}; pass `{name}.bool()`.")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}.")


def check_same_shape(**tensors: Tensor) -> None:
    """Raise ValueError unless every tensor has the same shape (names listed in the message)."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.shape != first.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but {first_name} has shape {tuple(first.shape)}; "
                "they must match."
            )


def check_choice(name: str, value: str, valid: Sequence[str]) -> None:
    """Raise ValueError unless ``value`` is one of ``valid`` (listed in the message)."""
    if value not in valid:
        raise ValueError(f"unknown {name}={value!r}; valid options are {sorted(valid)}.")


def check_range(name: str, value: float, lo: float, hi: float) -> None:
    """Raise ValueError unless ``lo <= value <= hi``."""
    if not lo <= value <= hi:  # also refuses NaN
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got {value}.")


def check_finite(**values: float | Tensor | None) -> None:
    """Raise ValueError unless every Python number among ``values`` is finite (names the argument).

    Tensors and None pass unchecked: reading a tensor's value would synchronise with the device.
    """
    for name, value in values.items():
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}.")


def check_nonempty(name: str, x: Tensor) -> None:
    """Raise ValueError if ``x`` has no rows (its first dimension, read from the shape) or no elements."""
    if x.dim() == 0:
        return
    if x.shape[0] == 0 or x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}); pass at least one row.")


def uniform(shape: Sequence[int], generator: torch.Generator, like: Tensor) -> Tensor:
    """Float32 U[0, 1) samples drawn from ``generator`` and moved to ``like.device``."""
    u = torch.rand(tuple(shape), generator=generator, device=generator.device, dtype=torch.float64)
    return u.to(device=like.device, dtype=torch.float32)


def uniform64(shape: Sequence[int], generator: torch.Generator, like: Tensor) -> Tensor:
    """Float64 U[0, 1) samples drawn from ``generator`` and moved to ``like.device``."""
    u = torch.rand(tuple(shape), generator=generator, device=generator.device, dtype=torch.float64)
    return u.to(device=like.device)
