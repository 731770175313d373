"""The KV cache of block diffusion as fixed-size tensors over the whole canvas (`StaticBlockCache`).

Every forward writes its block's keys/values into it in place (`KVCache.write_columns`). Columns
of later blocks are hidden by the cache's key padding, so attention sees exactly the finished
blocks and the current one (masked keys get weight 0), and every cached step has the same shapes:
one CUDA graph (`dllm_rollout.graphs`) serves the whole decode. A second view (`pair`) serves the
forwards that cover two blocks, a finished block and the next one, with a block-causal key limit
per query: again one shape, so one more graph.
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
        pair: the same tensors for a forward of two blocks [prev, prev + 2n): `write_columns` [2n]
            and `key_limit` [2n] (queries of the first block see columns < prev + n, those of
            the second < prev + 2n); set by `show_pair`.
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
        pair_columns = torch.zeros(2 * block, dtype=torch.long, device=keys[0].device)
        limit = torch.zeros(2 * block, dtype=torch.long, device=keys[0].device)
        self.pair = KVCache(keys, values, padding, write_columns=pair_columns, key_limit=limit)
        self.block = block

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows `rows` [n] (long, ascending) only: they are packed at the front of the
        same storage and every tensor becomes a view of its first n rows (nothing is allocated but
        one layer's rows at a time). `cache` and `pair` are rebuilt on the views."""
        from dllm_models.protocol import KVCache

        n = int(rows.numel())

        def pack(t: torch.Tensor) -> torch.Tensor:
            t[:n] = t[rows]  # the gather is a copy first, so overlapping rows are safe
            return t[:n]

        keys = [pack(k) for k in self.cache.keys]
        values = [pack(v) for v in self.cache.values]
        assert self.cache.key_padding is not None
        padding = pack(self.cache.key_padding)
        self.cache = KVCache(keys, values, padding, write_columns=self.cache.write_columns)
        self.pair = KVCache(keys, values, padding, write_columns=self.pair.write_columns,
                            key_limit=self.pair.key_limit)

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

    def show_pair(self, prev: int, start: int, end: int, real: torch.Tensor | None = None) -> None:
        """Set up `pair` for a forward of the finished block [prev, start) and the block [start, end).

        Marks [prev, end) visible (where `real`, [B, end - prev]) and makes [start, end) the
        single-block forwards' columns, as `show` does.
        """
        assert self.pair.write_columns is not None and self.pair.key_limit is not None
        n = self.block
        if start - prev != n or end - start != n:
            raise ValueError(f"show_pair needs two adjacent blocks of {n} columns, got [{prev}, {start}), [{start}, {end})")
        self.show(prev, start, None if real is None else real[:, :n])
        self.show(start, end, None if real is None else real[:, n:])
        torch.arange(prev, end, out=self.pair.write_columns)
        self.pair.key_limit[:n].fill_(start)
        self.pair.key_limit[n:].fill_(end)
