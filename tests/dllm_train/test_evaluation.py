"""Validation during training uses the dllm_eval benchmark runner."""

from __future__ import annotations

from pathlib import Path

from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_train import PhaseSpec, Run, benchmark_validator, read_metrics
from tests.dllm_train.helpers import tiny_config


class _NoState:
    def state(self) -> dict[str, object]:
        return {}

    def load_state(self, state: dict[str, object]) -> None:
        pass


def test_benchmark_validator_feeds_phase_metrics(tmp_path: Path) -> None:
    tok = build_tokenizer()
    model = build_tiny_model(tiny_config(), tok)
    validate = benchmark_validator(model, tok, ["gsm8k", "sudoku"], limit=2, batch_size=2,
                                   decoding={"max_new_tokens": 8, "steps": 8, "block_length": 8})
    run = Run(tmp_path, model, progress=False)
    run.run_phase(PhaseSpec(order=0, name="rl", steps=2, step_fn=lambda i: {"x": float(i)}, owner=_NoState(),
                            eval_fn=validate, eval_every=2))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert "eval/gsm8k_accuracy" not in records[0]
    assert 0.0 <= records[1]["eval/gsm8k_accuracy"] <= 1.0 and "eval/sudoku_score" in records[1]
    assert model.training  # restored after validation
