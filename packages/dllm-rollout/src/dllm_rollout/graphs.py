"""Decoding steps replayed as CUDA graphs (`GraphedStep`).

A cached block step at batch 64 launches ~1,600 small kernels; without a graph the host's launch
time, not the GPU, sets the step time. `SamplingConfig.speed.cuda_graphs=False` runs eagerly. A
model whose forward cannot be captured (host syncs, e.g. MoE routing with `.tolist()`) falls back to
eager calls on the first capture failure: the first failure of the process is logged as a warning
with its cause, and every one is counted (`capture_failures`, reported by the trainer's rollout
metrics as `graph_capture_failures`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

_failures = {"count": 0}  # captures that failed in this process (`capture_failures`)


def capture_failures() -> int:
    """How many `GraphedStep` captures failed in this process so far (each then ran eagerly)."""
    return _failures["count"]


def _capture_failed(err: Exception) -> None:
    if _failures["count"] == 0:
        logger.warning("a CUDA-graph capture failed (%s: %s); the step runs eagerly. Later failures are only "
                       "counted (rollout metric graph_capture_failures); rollout.speed.cuda_graphs=false turns "
                       "capturing off", type(err).__name__, err)
    _failures["count"] += 1


def graph_pool(device: torch.device, enabled: bool = True) -> Any:
    """A CUDA-graph memory pool that several `GraphedStep`s may share (None off CUDA or with graphs
    off, `enabled=False`).

    Graphs sharing a pool must not be replayed concurrently, and a graph's outputs must be read
    before a graph captured after it runs: true of decoding steps that run one after another.
    """
    if device.type != "cuda" or not enabled:
        return None
    return torch.cuda.graph_pool_handle()


class GraphedStep:
    """`fn(*inputs)` replayed from a CUDA graph; inputs are copied into static buffers.

    Every input must keep its shape, dtype and device across calls, and whatever else `fn` reads
    (weights, a StaticBlockCache) must be updated in place. The result tensors are the graph's
    own buffers: they are overwritten by the next call. Falls back to plain calls when graphs are
    off (`enabled=False`), the inputs are not on CUDA, or the capture fails (module doc).
    """

    def __init__(self, fn: Callable[..., Any], pool: Any = None, *, enabled: bool = True) -> None:
        """Args: pool: a `graph_pool` shared with other steps (None: the graph's own pool);
        enabled: capture at all (the config's `speed.cuda_graphs`)."""
        self.fn = fn
        self.pool = pool
        self.enabled = enabled
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
        if self.failed or not self.enabled or not inputs[0].is_cuda:
            return self.fn(*inputs)
        if self.graph is None:
            try:
                self._capture(inputs)
            except Exception as err:  # noqa: BLE001 - an uncapturable forward runs eagerly, warned and counted
                self.failed, self.graph, self.out, self.static = True, None, None, []
                _capture_failed(err)
                torch.cuda.synchronize()
                return self.fn(*inputs)
        for dst, src in zip(self.static, inputs):
            dst.copy_(src)
        assert self.graph is not None
        self.graph.replay()
        return self.out
