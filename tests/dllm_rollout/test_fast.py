"""Speed helpers: the LM head on the block's columns only is the same function as slicing."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout.fast import GraphedStep, block_forward
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
