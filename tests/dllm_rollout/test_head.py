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
