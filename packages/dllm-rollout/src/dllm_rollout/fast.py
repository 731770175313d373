"""Speed helpers of the decoders: LM head on the needed columns only, a static KV cache, CUDA graphs.

- `head_columns`: a forward whose output head runs on chosen sequence columns only. Decoders need
  the logits of the current block, not of the whole canvas: the [B, L, V] head matmul and its
  output (5 GB at B=64, L=256, V=152k in bf16) are skipped. The hidden states are those of the
  full forward, so the block's logits are the same function.
- `StaticBlockCache`: the KV cache of block diffusion as fixed-size [B, Hkv, W, D] tensors over
  the whole canvas; every forward writes its block's keys/values into it in place
  (`KVCache.write_columns`). Columns of later blocks are hidden by the cache's key padding, so
  attention sees exactly the finished blocks and the current one (masked keys get weight 0), and
  every cached step has the same shapes: one CUDA graph serves the whole decode.
- `GraphedStep`: replays a forward as a CUDA graph. A cached block step at batch 64 launches
  ~1,600 small kernels; without a graph the host's launch time, not the GPU, sets the step time.

Set `DLLM_ROLLOUT_CUDA_GRAPHS=0` (or `dllm_rollout.fast.CUDA_GRAPHS = False`) to run eagerly.
A model whose forward cannot be captured (host syncs, e.g. MoE routing with `.tolist()`) falls
back to eager calls on the first capture failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

CUDA_GRAPHS = os.environ.get("DLLM_ROLLOUT_CUDA_GRAPHS", "1") != "0"


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


def graph_pool(device: torch.device) -> Any:
    """A CUDA-graph memory pool that several `GraphedStep`s may share (None off CUDA or with graphs off).

    Graphs sharing a pool must not be replayed concurrently, and a graph's outputs must be read
    before a graph captured after it runs: true of decoding steps that run one after another.
    """
    if device.type != "cuda" or not CUDA_GRAPHS:
        return None
    return torch.cuda.graph_pool_handle()


class GraphedStep:
    """`fn(*inputs)` replayed from a CUDA graph; inputs are copied into static buffers.

    Every input must keep its shape, dtype and device across calls, and whatever else `fn` reads
    (weights, a StaticBlockCache) must be updated in place. The result tensors are the graph's
    own buffers: they are overwritten by the next call. Falls back to plain calls when graphs are
    off, the inputs are not on CUDA, or the capture fails.
    """

    def __init__(self, fn: Callable[..., Any], pool: Any = None) -> None:
        """Args: pool: a `graph_pool` shared with other steps (None: the graph's own pool)."""
        self.fn = fn
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: list[torch.Tensor] = []
        self.out: Any = None
        self.failed = False

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> None:
        self.static = [x.clone() for x in inputs]
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.fn(*self.static)  # warm-up: lazy inits, kernel selection
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.out = self.fn(*self.static)
        self.graph = graph

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.failed or not CUDA_GRAPHS or not inputs[0].is_cuda:
            return self.fn(*inputs)
        if self.graph is None:
            try:
                self._capture(inputs)
            except Exception:  # noqa: BLE001 - an uncapturable forward runs eagerly
                self.failed, self.graph, self.out, self.static = True, None, None, []
                torch.cuda.synchronize()
                return self.fn(*inputs)
        for dst, src in zip(self.static, inputs):
            dst.copy_(src)
        assert self.graph is not None
        self.graph.replay()
        return self.out
