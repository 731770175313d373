"""Validation during training uses the dllm_eval benchmark runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dllm_rollout import SamplingConfig
from dllm_train import PhaseSpec, Run, benchmark_validator, read_metrics
from tests.tiny_rl import TOK, tiny_model


class _NoState:
    def state(self) -> dict[str, object]:
        return {}

    def load_state(self, state: dict[str, object]) -> None:
        pass


def test_benchmark_validator_feeds_phase_metrics(tmp_path: Path) -> None:
    tok, model = TOK, tiny_model("llada")
    validate = benchmark_validator(model, tok, ["gsm8k", "sudoku"], limit=2, batch_size=2,
                                   rollout=SamplingConfig(max_new_tokens=8, steps=8, block_length=8))
    run = Run(tmp_path, model, progress=False)
    run.run_phase(PhaseSpec(order=0, name="rl", steps=2, step_fn=lambda i: {"x": float(i)}, owner=_NoState(),
                            eval_fn=validate, eval_every=2))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert "eval/gsm8k_accuracy" not in records[0]
    assert 0.0 <= records[1]["eval/gsm8k_accuracy"] <= 1.0 and "eval/sudoku_score" in records[1]
    assert model.training  # restored after validation


def test_validation_rows_are_the_callers_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import dllm_train.evaluation as evaluation

    seen: list[int | None] = []

    def spy(*args: Any, limit: int | None, **kwargs: Any) -> Any:
        seen.append(limit)
        return type("Result", (), {"accuracy": 0.5, "mean_score": 0.5})()

    monkeypatch.setattr(evaluation, "run_benchmark", spy)
    tok, model = TOK, tiny_model("llada")
    assert benchmark_validator(model, tok, ["gsm8k"], limit=3)() == {"eval/gsm8k_accuracy": 0.5,
                                                                      "eval/gsm8k_score": 0.5}
    benchmark_validator(model, tok, ["gsm8k"], limit=None)()
    assert seen == [3, None]
    with pytest.raises(TypeError):
        benchmark_validator(model, tok, ["gsm8k"])  # type: ignore[call-arg]  # no silent default
    with pytest.raises(ValueError, match="limit must be >= 1"):
        benchmark_validator(model, tok, ["gsm8k"], limit=0)



def test_validation_decodes_the_preset_at_the_rollout_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    import dllm_train.evaluation as evaluation

    seen: list[SamplingConfig] = []

    def spy(*args: Any, decoding: SamplingConfig, **kwargs: Any) -> Any:
        seen.append(decoding)
        return type("Result", (), {"accuracy": 0.5, "mean_score": 0.5})()

    monkeypatch.setattr(evaluation, "run_benchmark", spy)
    model = tiny_model("sdar")
    block = int(model.traits.block_length)
    # block diffusion: 2 steps per block, fewer than the 16 blocks a masked decoder would need
    rollout = SamplingConfig(max_new_tokens=16 * block, steps=2, block_length=block, temperature=1.0, top_k=50,
                             block_diffusion=True, eos_handling="truncate")
    benchmark_validator(model, TOK, ["gsm8k", "sudoku"], limit=1, rollout=rollout)()
    preset = SamplingConfig(max_new_tokens=16 * block, steps=2, block_length=block, cache="prefix",
                            block_diffusion=True)
    assert seen == [preset, preset]  # dare_local's greedy prefix-cache decoding, the rollout's lengths


def test_dream_validation_decodes_as_dare_eval_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation and `dare eval` resolve decoding by one rule (`dllm_eval.resolve_decoding`): on Dream,
    dare_local's temperature 0.2 and top-p 0.95 (before, validation decoded at temperature 0)."""
    import dllm_train.evaluation as evaluation
    from dllm_eval import get_benchmark, resolve_decoding

    seen: list[SamplingConfig] = []

    def spy(*args: Any, decoding: SamplingConfig, **kwargs: Any) -> Any:
        seen.append(decoding)
        return type("Result", (), {"accuracy": 0.5, "mean_score": 0.5})()

    monkeypatch.setattr(evaluation, "run_benchmark", spy)
    model = tiny_model("dream")
    rollout = SamplingConfig(max_new_tokens=16, steps=8, block_length=8, temperature=0.2)
    benchmark_validator(model, TOK, ["gsm8k"], limit=1, rollout=rollout)()
    lengths = {"max_new_tokens": 16, "steps": 8, "block_length": 8}
    # what `dare eval --max-new-tokens 16 --steps 8 --block-length 8` decodes with (apps/dare evaluate.py)
    dare_eval = resolve_decoding(get_benchmark("gsm8k"), "dare_local", family="dream", block_length=None,
                                 overrides=lengths)
    assert seen == [dare_eval]
    assert (seen[0].temperature, seen[0].top_p) == (0.2, 0.95)
