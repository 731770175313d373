"""A bound on the steps of one block, so that a decoder that stops committing tokens fails loudly.

With finite logits every decoder here finishes a block within a known number of steps: the quota
schedules commit everything left at their last step, and threshold decoding commits at least one
token per row and step. Non-finite logits (a model whose weights were never loaded or initialised,
an overflow in low precision) make every proposal the last vocabulary id, which may be the mask
itself, and the block would never fill. The bound turns that endless loop into an error that
says why.
"""

from __future__ import annotations

import torch


class NonFiniteLogits(RuntimeError):
    """A block that cannot finish because the model's logits are not finite (NaN or inf): its
    weights hold non-finite or overflowing values. A trainer tells a diverged run by it."""


def check_progress(step: int, limit: int, start: int, end: int, logits: torch.Tensor | None) -> None:
    """Raise when block [start, end) is still unfinished after `limit` steps.

    Args:
        step: steps the block has taken; limit: the most it can need with finite logits.
        logits: the last step's logits (for the diagnosis), or None before the first step.
    """
    if step < limit:
        return
    head = f"block [{start}, {end}) still has masked positions after {step} steps, more than the {limit} it can need"
    if logits is not None and not bool(torch.isfinite(logits).all()):
        raise NonFiniteLogits(
            f"{head}: the model's logits are not finite (NaN or inf): check that its weights were loaded or "
            "initialised (`build_model` leaves them uninitialised; call `reset_parameters` or load a "
            "checkpoint) and that its dtype does not overflow")
    raise RuntimeError(f"{head}: the decoder did not commit a token for some row at some step")
