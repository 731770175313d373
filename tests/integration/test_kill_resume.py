"""Resume after kill -9: the rerun's metrics equal an uninterrupted run's, step for step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.dare.helpers import TINY, measured

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40
ARGS = [*TINY, f"trainer.max_steps={STEPS}", "trainer.save_every=1", "--no-progress"]


def _cmd(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "apps" / "dare"), "train", *ARGS, "--output-dir", str(out)]


def test_kill_9_mid_run_then_rerun_matches_uninterrupted(tmp_path: Path) -> None:
    straight = subprocess.run(_cmd(tmp_path / "straight"), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert straight.returncode == 0, straight.stderr

    out = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(out), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    def rl_checkpoint_exists() -> bool:
        root = out / "checkpoints"
        return root.is_dir() and any(p.name.startswith("1-rl-") for p in root.iterdir())

    while not rl_checkpoint_exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no RL checkpoint appeared"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    rerun = subprocess.run(_cmd(out), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming from" in rerun.stderr
    import json

    a = measured(tmp_path / "straight" / "metrics.jsonl")
    b = measured(out / "metrics.jsonl")
    assert len(a) == STEPS and a == b

    sa = json.loads((tmp_path / "straight" / "summary.json").read_text())
    sb = json.loads((out / "summary.json").read_text())
    assert sa["eval_accuracy_after_rl"] == sb["eval_accuracy_after_rl"]
