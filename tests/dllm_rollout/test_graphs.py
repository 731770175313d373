"""CUDA-graph decoding steps against eager ones (GPU only): same tokens, same log-probs, and the
graphs were really captured (a failed capture falls back to eager calls, warned once and counted)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_rollout import SpeedConfig, generate, graphs
from dllm_rollout.graphs import GraphedStep

pytestmark = pytest.mark.gpu

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]


def _cuda_model(family: str) -> torch.nn.Module:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from tests.dllm_models.tiny_configs import build_tiny

    return build_tiny(family).cuda().eval()


def _spy_captures(monkeypatch: pytest.MonkeyPatch) -> list[GraphedStep]:
    """The steps whose graphs are captured from now on, in order."""
    captured: list[GraphedStep] = []
    capture = GraphedStep._capture

    def spy(self: GraphedStep, inputs: tuple[torch.Tensor, ...]) -> None:
        capture(self, inputs)
        captured.append(self)

    monkeypatch.setattr(GraphedStep, "_capture", spy)
    return captured


def _decode_both(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module, **kwargs: Any) -> tuple[Any, Any, int, int]:
    """Graphed and eager decodes, the captures and the failed captures of the graphed one."""
    captured = _spy_captures(monkeypatch)
    failures = graphs.capture_failures()
    graphed = generate(model, PROMPTS, seed=4, record_trajectory=True, speed=SpeedConfig(cuda_graphs=True), **kwargs)
    failed = graphs.capture_failures() - failures
    eager = generate(model, PROMPTS, seed=4, record_trajectory=True, speed=SpeedConfig(cuda_graphs=False), **kwargs)
    return graphed, eager, len(captured), failed


@pytest.mark.parametrize("family", ["llada", "Dream"])
@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_masked_steps_replay_as_graphs(monkeypatch: pytest.MonkeyPatch, family: str, cache: str | None,
                                       temperature: float) -> None:
    model = _cuda_model(family)
    graphed, eager, captures, failed = _decode_both(monkeypatch, model, max_new_tokens=16, steps=8, block_length=8,
                                                    cache=cache, temperature=temperature, top_k=20)
    # no cache: eager full forwards; dual: one graph; prefix: one per block width
    assert captures == {None: 0, "dual": 1, "prefix": 2}[cache] and failed == 0
    assert torch.equal(graphed.response_ids, eager.response_ids)
    torch.testing.assert_close(graphed.step_logp, eager.step_logp, rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", ["sdar", "llada2_moe"])
@pytest.mark.parametrize("rule", [{}, {"remasking": "low_confidence_dynamic", "threshold": 0.05}])
def test_block_steps_replay_as_graphs(monkeypatch: pytest.MonkeyPatch, family: str, rule: dict[str, Any]) -> None:
    """Static quota and DARE's threshold rule (a commit count known only on the device): the forwards
    are the same graphs, the rule runs after them."""
    model = _cuda_model(family)
    bl = int(model.traits.block_length)  # type: ignore[union-attr]
    graphed, eager, captures, failed = _decode_both(monkeypatch, model, max_new_tokens=3 * bl, steps=bl,
                                                    block_length=bl, cache="prefix", temperature=1.0, top_k=20,
                                                    **rule)
    if family == "sdar":
        assert captures == 2  # the block step, and the two-block step that folds a finished block's store pass
        assert failed == 0
    else:  # a capture that failed (MoE routing reads back to the host) ran eagerly and was counted
        assert captures + failed == 2, (captures, failed)
    assert torch.equal(graphed.response_ids, eager.response_ids)
    torch.testing.assert_close(graphed.step_logp, eager.step_logp, rtol=0, atol=1e-4)


@pytest.mark.parametrize("rule", [{}, {"remasking": "low_confidence_dynamic", "threshold": 0.05}])
def test_block_steps_recapture_after_rows_retire(monkeypatch: pytest.MonkeyPatch, rule: dict[str, Any]) -> None:
    """Finished rows leave the batch: the cached steps are captured anew at the smaller batch and give
    the samples of eager steps on a batch that keeps every row (static quota and the threshold rule)."""
    import dllm_rollout.block as block
    from tests.dllm_rollout.test_block import _stop_rows_apart

    model = _cuda_model("sdar")
    prompts = [PROMPTS[i % 3] for i in range(10)]
    args: dict[str, Any] = {"max_new_tokens": 24, "steps": 4, "block_length": 4, "seed": list(range(10)),
                            "temperature": 1.0, "top_k": 20, "cache": "prefix", "record_trajectory": True,
                            "eos_handling": "truncate", **rule}
    _stop_rows_apart(monkeypatch, model, prompts, args)
    captured = _spy_captures(monkeypatch)
    graphed = generate(model, prompts, speed=SpeedConfig(cuda_graphs=True, retire_rows=1), **args)
    eager = generate(model, prompts, speed=SpeedConfig(cuda_graphs=False, retire_rows=0), **args)
    batches = sorted({int(g.static[0].shape[0]) for g in captured}, reverse=True)
    assert batches[0] == 10 and len(batches) >= 2, batches  # captured again at fewer rows
    assert int((eager.response_mask.sum(1) < 24).sum()) >= 2
    assert torch.equal(graphed.response_ids, eager.response_ids)
    torch.testing.assert_close(graphed.step_logp, eager.step_logp, rtol=0, atol=1e-4)
