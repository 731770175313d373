"""Checkpoints are atomic, ordered and pruned; temporary folders never count."""

from __future__ import annotations

from pathlib import Path

import torch

from dllm_train import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def test_save_list_prune_and_load(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, order=1, phase="rl", step=step, model=tiny_llada,
                        state={"step": step}, keep=2)
    save_checkpoint(tmp_path, order=0, phase="sft", step=9, model=tiny_llada, state={}, keep=5)
    refs = list_checkpoints(tmp_path)
    assert [(r.phase, r.step) for r in refs] == [("sft", 9), ("rl", 2), ("rl", 3)]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and (latest.phase, latest.step) == ("rl", 3)
    with torch.no_grad():
        for p in tiny_llada.parameters():
            p.add_(1.0)
    state = load_checkpoint(latest, tiny_llada)
    assert state == {"step": 3}


def test_half_written_checkpoint_is_ignored(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    save_checkpoint(tmp_path, order=0, phase="rl", step=1, model=tiny_llada, state={})
    # a crash mid-write leaves a temporary folder, and a folder without trainer_state.pt
    (tmp_path / "checkpoints" / ".tmp-abc").mkdir()
    (tmp_path / "checkpoints" / "0-rl-000002" / "model").mkdir(parents=True)
    ref = latest_checkpoint(tmp_path)
    assert ref is not None and ref.step == 1
