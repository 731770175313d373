"""benchmarks/scale_out.py: its figures worked by hand, and its --tiny run on two CPU Ray ranks."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def scale_out() -> ModuleType:
    """benchmarks/scale_out.py as a module (it imports benchmarks/e2e_gpu.py beside it)."""
    path = ROOT / "benchmarks" / "scale_out.py"
    spec = importlib.util.spec_from_file_location("scale_out", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_efficiency_is_rows_per_second_per_gpu_against_the_smallest_point() -> None:
    eff = scale_out().scaling_efficiency
    # 1 GPU: 10 rows/s. 2 GPUs: 18 rows/s = 9 per GPU -> 9 / 10 = 0.9. 4 GPUs: 32 = 8 per GPU -> 0.8.
    assert eff([(1, 10.0), (2, 18.0), (4, 32.0)]) == pytest.approx({1: 1.0, 2: 0.9, 4: 0.8})
    # 1 GPU failed (no rate): 2 GPUs is the baseline, 9 rows/s per GPU.
    # 8 GPUs: 54 rows/s = 6.75 per GPU -> 6.75 / 9 = 0.75; the failed point gets none.
    assert eff([(1, None), (8, 54.0), (2, 18.0)]) == pytest.approx({2: 1.0, 8: 0.75})
    assert eff([(1, None)]) == {}


def test_step_time_drops_the_first_step_and_the_weight_gathering_last_one() -> None:
    steps = scale_out().step_seconds
    # lines at 30 s (start-up + step 1), 40, 52 (step 3), 70 (step 4, + the driver's weight gather)
    assert steps([30.0, 40.0, 52.0, 70.0]) == pytest.approx([10.0, 12.0])
    assert steps([30.0, 40.0, 55.0]) == pytest.approx([10.0])
    assert steps([30.0, 41.0]) == pytest.approx([11.0])  # too few lines to drop the last
    assert steps([30.0]) == []


def test_train_row_figures_from_metrics_lines() -> None:
    recs: list[dict[str, Any]] = [
        {"step": 1, "rollout_s": 9.0, "old_s": 1.0, "update_s": 5.0, "response_length": 90.0, "peak_gib": 30.0},
        {"step": 2, "rollout_s": 4.0, "old_s": 1.0, "update_s": 3.0, "response_length": 100.0, "peak_gib": 31.5},
        {"step": 3, "rollout_s": 4.0, "old_s": 1.0, "update_s": 3.0, "response_length": 80.0, "peak_gib": 31.0},
    ]
    cfg = {"rl": {"prompts_per_step": 4, "group_size": 8}}
    row = scale_out().train_row(recs, [20.0, 30.0, 45.0], cfg, gpus=2)
    # 4 x 8 = 32 rows, 16 per GPU; steady step: step 2 only (20 -> 30 s): 10 s, 3.2 rows/s
    assert (row["rows_per_step"], row["rows_per_gpu"], row["steps_done"]) == (32, 16, 3)
    assert row["step_s"] == pytest.approx(10.0) and row["rows_s"] == pytest.approx(3.2)
    # step 2's parts: 4 + 1 + 3 = 8 s; generated: 100 tokens x 32 rows / 4 s = 800 tok/s, 400 per GPU
    assert row["parts_s"] == pytest.approx(8.0) and row["reference_s"] is None
    assert row["gen_tok_s"] == pytest.approx(800.0) and row["gen_tok_s_per_gpu"] == pytest.approx(400.0)
    assert row["peak_gib"] == 31.5  # the largest over every step


def test_rl_step_reports_the_largest_ranks_peak_memory() -> None:
    """The peak column's source: `rl_step` keeps the max of the ranks' `peak_gib`, averages timings."""
    from dllm_algorithms import D1
    from dllm_train import PromptBatch, rl_step
    from dllm_train.step import RankRollout, RolloutArgs

    class TwoRanks:
        data_parallel = 2
        size = 2

        def group_of(self, rank: int) -> int:
            return rank

        def rollout(self, args: list[RolloutArgs]) -> list[RankRollout]:
            return [RankRollout(scores=torch.tensor([1.0, 0.0]), lengths=torch.tensor([4.0, 6.0])) for _ in args]

        def update(self, advantages: list[torch.Tensor]) -> list[dict[str, float]]:
            return [{"update_s": 2.0, "peak_gib": 40.0}, {"update_s": 4.0, "peak_gib": 55.0}]

    metrics = rl_step(0, prompts=lambda step: PromptBatch([[1, 2], [3]], ["a", "b"], 2), ranks=TwoRanks(),
                      algorithm=D1(), seed=0)
    assert metrics["peak_gib"] == 55.0 and metrics["update_s"] == 3.0
    assert metrics["response_length"] == 5.0


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(900)
def test_scale_out_tiny_curve_and_moe_row_on_two_cpu_ranks(tmp_path: Path) -> None:
    out = tmp_path / "scale_out.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale_out.py"), "--tiny", "--moe", "--json", str(out),
         "--timeout", "400"],
        cwd=ROOT, capture_output=True, text=True, timeout=870, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = {r["run"]: r for r in result["rows"]}
    assert set(rows) == {"sdar-bgpo-x1", "sdar-bgpo-x2", "sdar_moe-cj-grpo-x2"}, proc.stdout[-4000:]
    for name, row in rows.items():
        assert row["status"] == "ok" and row["rc"] == 0, (name, row.get("stderr_tail"))
        assert row["steps_done"] == result["steps"] == 3, name
        assert "trainer.backend=ray" in row["command"] and f"trainer.num_workers={row['gpus']}" in row["command"]
        for key in ("step_s", "rollout_s", "old_s", "update_s", "parts_s", "gen_tok_s", "gen_tok_s_per_gpu",
                    "rows_s", "host_peak_gib"):
            assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] > 0, (name, key, row[key])
        assert row["gen_tok_s_per_gpu"] == pytest.approx(row["gen_tok_s"] / row["gpus"])
        assert row["peak_gib"] is None  # CPU ranks report no device memory
    one, two = rows["sdar-bgpo-x1"], rows["sdar-bgpo-x2"]
    assert two["rows_per_step"] == 2 * one["rows_per_step"] and two["rows_per_gpu"] == one["rows_per_gpu"]
    assert one["efficiency"] == pytest.approx(1.0)
    assert two["efficiency"] == pytest.approx((two["rows_per_step"] / two["step_s"] / 2)
                                              / (one["rows_per_step"] / one["step_s"]))
    moe = rows["sdar_moe-cj-grpo-x2"]
    assert moe["moe"] and moe["experts"] == scale_out().MOE_PLACEMENT and "efficiency" not in moe
    assert moe["num_experts"] == 128 and 0 < moe["expert_params"] < moe["total_params"]
    assert "experts:" in proc.stdout
