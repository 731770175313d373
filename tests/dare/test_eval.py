"""`dare eval` on a tiny checkpoint: table, manifest, batch-size invariance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_models import save_model
from tests.dare.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny_config()
    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_model(build_tiny_model(cfg, tok), path, tokenizer=tok)
    return path


def _eval(ckpt: Path, out: Path, batch_size: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "apps" / "dare"), "eval", str(ckpt), "--benchmarks", "gsm8k,countdown",
         "--limit", "4", "--batch-size", str(batch_size), "--max-new-tokens", "8", "--steps", "8",
         "--block-length", "8", "--output-dir", str(out), *extra],
        capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_eval_writes_table_manifest_and_is_batch_invariant(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Batch size and the speed switches change no response; the manifest records the switches."""
    a = _eval(tiny_checkpoint, tmp_path / "a", batch_size=4)
    assert a.returncode == 0, a.stderr
    assert "gsm8k" in a.stdout and "countdown" in a.stdout
    manifest = json.loads((tmp_path / "a" / "gsm8k" / "manifest.json").read_text())
    assert manifest["decoding"]["steps"] == 8
    assert manifest["decoding"]["speed"]["cuda_graphs"] is True and manifest["kernels"]["decode_attention"] is True
    b = _eval(tiny_checkpoint, tmp_path / "b", 1, "--speed", "cuda_graphs=false", "--speed", "fused_sampling=false",
              "--kernels", "decode_attention=false")
    assert b.returncode == 0, b.stderr
    manifest = json.loads((tmp_path / "b" / "gsm8k" / "manifest.json").read_text())
    assert manifest["decoding"]["speed"]["cuda_graphs"] is False and manifest["decoding"]["speed"]["fused_sampling"] is False
    assert manifest["kernels"]["decode_attention"] is False
    for bench in ("gsm8k", "countdown"):
        rows_a = [json.loads(x) for x in (tmp_path / "a" / bench / "samples.jsonl").read_text().splitlines()]
        rows_b = [json.loads(x) for x in (tmp_path / "b" / bench / "samples.jsonl").read_text().splitlines()]
        assert [r["response"] for r in rows_a] == [r["response"] for r in rows_b]


def test_presets_side_by_side(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "apps" / "dare"), "eval", str(tiny_checkpoint), "--benchmarks", "gsm8k",
         "--preset", "dare_local,d1", "--limit", "2", "--max-new-tokens", "8", "--steps", "8",
         "--block-length", "8", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    table = (tmp_path / "results.md").read_text()
    assert "dare_local" in table and "d1" in table
    prompts = {}
    for preset in ("dare_local", "d1"):
        manifest = json.loads((tmp_path / preset / "gsm8k" / "manifest.json").read_text())
        prompts[preset] = json.dumps(manifest, sort_keys=True)
    assert prompts["dare_local"] != prompts["d1"]  # different protocols, recorded as such


def test_reward_modes_side_by_side(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # in process: a subprocess under a 300 s limit failed on a busy 2-core machine (its imports alone)
    from dare.cli import main

    assert main(["eval", str(tiny_checkpoint), "--benchmarks", "countdown", "--preset", "d1", "--reward-mode",
                 "d1,dare", "--limit", "2", "--max-new-tokens", "8", "--steps", "8", "--block-length", "8",
                 "--output-dir", str(tmp_path)]) == 0
    table = (tmp_path / "results.md").read_text()
    assert "| countdown | d1 | d1 | 2 |" in table
    assert "| countdown | d1 | dare | 2 |" in table
    manifest = json.loads((tmp_path / "countdown" / "reward-dare" / "manifest.json").read_text())
    assert manifest["reward_mode"] == "dare"
    first = [json.loads(x)["response"] for x in (tmp_path / "countdown" / "samples.jsonl").read_text().splitlines()]
    second = [json.loads(x)["response"]
              for x in (tmp_path / "countdown" / "reward-dare" / "samples.jsonl").read_text().splitlines()]
    assert first == second  # scored twice, generated once


def test_a_second_eval_into_a_busy_output_dir_is_refused(tiny_checkpoint: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # issue #38 T9: two `dare eval` into one --output-dir both exited 0, one result set overwriting
    # the other. The first holds the folder's lock (as `dare train` holds a run folder's).
    import fcntl
    import os

    from dare.cli import main

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": 4242, "host": "elsewhere", "started": "now"}).encode())
        with pytest.raises(SystemExit) as err:
            main(["eval", str(tiny_checkpoint), "--benchmarks", "gsm8k", "--limit", "1", "--output-dir", str(out)])
    finally:
        os.close(fd)
    assert err.value.code == 2
    assert "is in use by another run (pid 4242 on elsewhere" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing evaluated, nothing written


def test_default_eval_folders_started_in_the_same_second_differ(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #38 T9: runs/eval-<time> to the second: two evaluations started together shared it
    import time

    from dare.evaluate import new_eval_folder

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-000000")
    first, second, third = (new_eval_folder(tmp_path) for _ in range(3))
    assert [p.name for p in (first, second, third)] == ["eval-20260101-000000", "eval-20260101-000000-1",
                                                        "eval-20260101-000000-2"]
    assert all(p.is_dir() for p in (first, second, third))


def test_eval_speed_flags_are_checked_before_loading() -> None:
    import argparse

    from dare.evaluate import speed_settings
    from dllm_models import KernelConfig
    from dllm_rollout import SpeedConfig

    ok = argparse.Namespace(speed=["retire_rows=0"], kernels=["decode_splits=2"])
    assert speed_settings(ok) == (SpeedConfig(retire_rows=0), KernelConfig(decode_splits=2))
    with pytest.raises(ValueError, match=r"--speed: .*retire_rows must be >= 0"):
        speed_settings(argparse.Namespace(speed=["retire_rows=-1"], kernels=[]))
    with pytest.raises(ValueError, match=r"--kernels: unknown config key 'kernels.decode_spam'.*decode_span"):
        speed_settings(argparse.Namespace(speed=[], kernels=["decode_spam=false"]))
