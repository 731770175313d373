"""The output head on chosen sequence columns only.

Decoders need the logits of the current block, not of the whole canvas: `head_columns` makes a
forward apply its output head to chosen columns, so the [B, L, V] head matmul and its output are
skipped. The hidden states are those of the full forward, so the block's logits are the same
function.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def head_columns(model: Any, columns: torch.Tensor) -> Iterator[None]:
    """Within the block, `model(...)` applies its output head to sequence columns `columns` only.

    The returned `logits` are [B, len(columns), V]: column i holds the raw logits of sequence
    position `columns[i]` (no logit shift applied).

    Args:
        columns: long [n] column indices into the forward's sequence axis.
    """
    from dllm_models.logprob import output_head

    def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].index_select(1, columns), *args[1:])

    handle = output_head(model).register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def raw_columns(start: int, end: int, shift: int, device: torch.device) -> torch.Tensor:
    """Raw logit columns that predict positions [start, end) under a logit shift of 0 or 1.

    With shift 1 (Dream) position j is read at j - 1, except position 0, which reads itself.
    """
    return (torch.arange(start, end, device=device) - shift).clamp(min=0)


def block_forward(model: Any, ids: torch.Tensor, start: int, end: int, *, shift: int = 0,
                  **kwargs: Any) -> Any:
    """`model(ids, **kwargs)` whose logits are [B, end - start, V]: the predictions of positions
    [start, end) of `ids` (logit shift applied), the head run on those columns only."""
    with head_columns(model, raw_columns(start, end, shift, ids.device)):
        return model(ids, **kwargs)
