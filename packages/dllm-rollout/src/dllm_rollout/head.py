"""The output head on chosen sequence columns only.

Decoders need the logits of the current block, not of the whole canvas: a family's forward takes
`logit_columns=` and applies its output head to those columns only, so the [B, L, V] head matmul
and its output are skipped. The hidden states are those of the full forward, so the block's logits
are the same function.
"""

from __future__ import annotations

from typing import Any

import torch


def raw_columns(start: int, end: int, shift: int, device: torch.device) -> torch.Tensor:
    """Raw logit columns that predict positions [start, end) under a logit shift of 0 or 1.

    With shift 1 (Dream) position j is read at j - 1, except position 0, which reads itself.
    """
    return (torch.arange(start, end, device=device) - shift).clamp(min=0)


def block_forward(model: Any, ids: torch.Tensor, start: int, end: int, *, shift: int = 0,
                  **kwargs: Any) -> Any:
    """`model(ids, **kwargs)` whose logits are [B, end - start, V]: the predictions of positions
    [start, end) of `ids` (logit shift applied), the head run on those columns only (`logit_columns`)."""
    return model(ids, logit_columns=raw_columns(start, end, shift, ids.device), **kwargs)
