"""Decoding steps replayed as CUDA graphs (`GraphedStep`).

A cached block step at batch 64 launches ~1,600 small kernels; without a graph the host's launch
time, not the GPU, sets the step time. Set `DLLM_ROLLOUT_CUDA_GRAPHS=0` (or
`dllm_rollout.graphs.CUDA_GRAPHS = False`) to run eagerly. A model whose forward cannot be captured
(host syncs, e.g. MoE routing with `.tolist()`) falls back to eager calls on the first capture
failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

CUDA_GRAPHS = os.environ.get("DLLM_ROLLOUT_CUDA_GRAPHS", "1") != "0"


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
            self.fn(*self.static)  # lazy inits, kernel selection
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
