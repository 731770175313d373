"""benchmarks/e2e_gpu.py --tiny: the user's commands on toy release-layout folders, on CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = "llada-d1,eval-sdar"


@pytest.mark.slow
def test_e2e_gpu_tiny_runs_exit_0_with_finite_figures(tmp_path: Path) -> None:
    out = tmp_path / "e2e_gpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "e2e_gpu.py"), "--tiny", "--runs", RUNS, "--resume",
         "--workdir", str(tmp_path / "work"), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = {r["run"]: r for r in result["rows"]}
    assert set(rows) == set(RUNS.split(","))
    for name, row in rows.items():
        assert row["status"] == "ok" and row["rc"] == 0, (name, row.get("stderr_tail"))
    rl = rows["llada-d1"]
    assert rl["steps_done"] == result["steps"]
    for key in ("step_s", "rollout_s", "update_s", "gen_tok_s", "response_length", "est_full_step_s"):
        assert isinstance(rl[key], float) and math.isfinite(rl[key]) and rl[key] > 0, (key, rl[key])
    assert rl["resume"]["continued"], rl["resume"]
    ev = rows["eval-sdar"]
    assert ev["samples"] > 0 and math.isfinite(ev["tok_s"]) and ev["tok_s"] > 0
    models = result["models"]
    assert models["LLaDA-8B-Instruct"]["tokenizer_len"] == 126464  # stand-in tokenizer, release vocabulary
