"""The KV cache of block diffusion as fixed-size tensors over the whole canvas (`StaticBlockCache`).

Every forward writes its block's keys/values into it in place (`KVCache.write_columns`). Columns
of later blocks are hidden by the cache's key padding, so attention sees exactly the finished
blocks and the current one (masked keys get weight 0), and every cached step has the same shapes:
one CUDA graph (`dllm_rollout.graphs`) serves the whole decode.
"""

from __future__ import annotations

from typing import Any

import torch


class StaticBlockCache:
    """KV cache of block diffusion as fixed [B, Hkv, W, D] tensors over the canvas (see module doc).

    The model writes each forward's keys/values in place (`KVCache.write_columns`, dllm_models)
    into the columns of the current block, and its queries see the columns marked in the key
    padding: the finished blocks and the current one. Nothing is allocated or concatenated per
    step, and every step has the same shapes.

    Attributes:
        cache: the KVCache handed to the model; `cache.key_padding` [B, W] is True on visible,
            real columns; `cache.write_columns` [n] the columns the next forward writes.
    """

    def __init__(self, like: Any, batch: int, width: int, block: int) -> None:
        """Allocate from the layout of `like` (a KVCache with at least one position).

        Args:
            block: positions per forward (the block length): the size of `write_columns`.
        """
        from dllm_models.protocol import KVCache

        def empty(t: torch.Tensor) -> torch.Tensor:
            return t.new_zeros((batch, t.shape[1], width, t.shape[3]))

        keys = [empty(k) for k in like.keys]
        values = [empty(v) for v in like.values]
        padding = torch.zeros((batch, width), dtype=torch.bool, device=keys[0].device)
        columns = torch.zeros(block, dtype=torch.long, device=keys[0].device)
        self.cache = KVCache(keys, values, padding, write_columns=columns)

    def store(self, start: int, kv: Any, real: torch.Tensor | None = None) -> None:
        """Copy the keys/values of columns [start, start + n) from `kv` and mark them visible.

        Args:
            kv: KVCache of n positions; real: [B, n] bool, False on padding columns (default all real).
        """
        n = kv.keys[0].shape[2]
        for dst, src in zip(self.cache.keys, kv.keys):
            dst[:, :, start:start + n].copy_(src)
        for dst, src in zip(self.cache.values, kv.values):
            dst[:, :, start:start + n].copy_(src)
        self.show(start, start + n, real)

    def show(self, start: int, end: int, real: torch.Tensor | None = None) -> None:
        """Mark columns [start, end) visible (where `real`) and make them the next forwards' columns."""
        assert self.cache.key_padding is not None and self.cache.write_columns is not None
        if real is None:
            self.cache.key_padding[:, start:end] = True
        else:
            self.cache.key_padding[:, start:end] = real
        if end - start == self.cache.write_columns.numel():
            torch.arange(start, end, out=self.cache.write_columns)
