"""Speed helpers: the LM head on the block's columns only is the same function as slicing."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout.graphs import GraphedStep
from dllm_rollout.head import block_forward
from tests.dllm_rollout.conftest import tiny


@pytest.mark.parametrize("shift", [0, 1])
def test_block_forward_equals_sliced_full_logits(shift: int) -> None:
    model = tiny("sdar")
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        got = block_forward(model, ids, 4, 8, shift=shift).logits
    cols = (torch.arange(4, 8) - shift).clamp(min=0)
    torch.testing.assert_close(got, full[:, cols], rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 4, full.shape[-1])


def test_graphed_step_runs_eagerly_off_cuda() -> None:
    calls: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x * 2

    step = GraphedStep(fn)
    assert torch.equal(step(torch.ones(3)), torch.full((3,), 2.0)) and step.graph is None and len(calls) == 1


class _CudaLooking(torch.Tensor):
    """A CPU tensor that claims to live on CUDA, so `GraphedStep` tries a capture off the GPU."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_a_failed_capture_warns_once_and_is_counted(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A capture that raises runs the step eagerly, logs one warning per process (not one per step) and
    adds one to `capture_failures` per failed step; a step with graphs off never tries."""
    from dllm_rollout import graphs

    def broken(self: GraphedStep, inputs: tuple[torch.Tensor, ...]) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(GraphedStep, "_capture", broken)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setitem(graphs._failures, "count", 0)
    x = torch.ones(3).as_subclass(_CudaLooking)
    with caplog.at_level("WARNING", logger="dllm_rollout.graphs"):
        outs = [GraphedStep(lambda t: t * 2)(x) for _ in range(3)]
        off = GraphedStep(lambda t: t * 3, enabled=False)
        assert torch.equal(off(x), torch.full((3,), 3.0))
    assert all(torch.equal(o, torch.full((3,), 2.0)) for o in outs)
    assert graphs.capture_failures() == 3
    warnings = [r for r in caplog.records if r.name == "dllm_rollout.graphs"]
    assert len(warnings) == 1 and "operation not permitted" in warnings[0].getMessage()


@pytest.mark.parametrize(("family", "cache"), [("llada", None), ("llada", "prefix"), ("llada", "dual"),
                                               ("sdar", "prefix")])
def test_decoding_leaves_no_reference_cycles(family: str, cache: str | None) -> None:
    """A decoder's canvas-wide KV cache and CUDA graphs are freed when `decode` returns, not at the
    next garbage collection (on a GPU, a cycle kept a 17 GB LLaDA-8B cache alive into the update)."""
    import gc

    from dllm_rollout import generate

    model = tiny(family)
    kwargs: dict[str, object] = ({"max_new_tokens": 16, "steps": 8, "block_length": 8} if family == "llada" else
                                 {"max_new_tokens": 8, "steps": 4, "block_length": 4})
    gc.collect()
    gc.disable()
    try:
        generate(model, [[1, 2, 3], [4, 5, 6, 7, 8]], cache=cache, temperature=1.0, **kwargs)  # type: ignore[arg-type]
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert unreachable == 0
