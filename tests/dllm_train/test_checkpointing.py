"""Checkpoints are atomic, ordered and pruned; temporary folders never count."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
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


def test_model_with_lora_adapters_resumes(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    pytest.importorskip("peft")
    from dllm_models import apply_lora

    model = apply_lora(tiny_llada, rank=2, alpha=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)  # adapters away from their zero init
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    save_checkpoint(tmp_path, order=0, phase="sft", step=1, model=model, state={"step": 1})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ref = latest_checkpoint(tmp_path)
    assert ref is not None and load_checkpoint(ref, model) == {"step": 1}
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())


def _torch_save_full_disk() -> tuple[Any, str, BaseException]:
    import torch

    return torch, "save", RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3261214848 vs 3261214740")


def _safetensors_full_disk() -> tuple[Any, str, BaseException]:
    # seen on the H200: safetensors reports ENOSPC as its own SafetensorError, neither OSError nor RuntimeError
    from safetensors import SafetensorError

    import dllm_models.checkpoint as ckpt

    return ckpt, "save_file", SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("failure", [_torch_save_full_disk, _safetensors_full_disk], ids=["torch.save", "safetensors"])
def test_a_failed_checkpoint_write_says_why_and_leaves_no_partial_folder(failure: Any, tmp_path: Path,
                                                                          monkeypatch: Any) -> None:
    from dllm_train import list_checkpoints, save_checkpoint
    from tests.tiny_rl import tiny_model

    module, name, error = failure()

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(module, name, full_disk)
    # the error's own words (e.g. "No space left on device") and the fix
    with pytest.raises(OSError, match=f"{type(error).__name__}: {re.escape(str(error))}.*free disk space"):
        save_checkpoint(tmp_path, order=0, phase="rl", step=1, model=tiny_model("llada"), state={})
    assert list_checkpoints(tmp_path) == []
    assert not [p for p in (tmp_path / "checkpoints").iterdir()]


def test_keep_checkpoints_must_leave_one() -> None:
    from dllm_train import TrainerConfig

    assert TrainerConfig(keep_checkpoints=1).keep_checkpoints == 1
    with pytest.raises(ValueError, match="trainer.keep_checkpoints must be >= 1"):
        TrainerConfig(keep_checkpoints=0)
