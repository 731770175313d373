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


def _three(tmp_path: Path, model: torch.nn.Module) -> list[Path]:
    return [save_checkpoint(tmp_path, order=0, phase="rl", step=s, model=model, state={"step": s}, keep=3)
            for s in (1, 2, 3)]


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("torn", ["model/model.safetensors", "trainer_state.pt", "manifest.json"])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_older_one_resumes(
        torn: str, tmp_path: Path, tiny_llada: torch.nn.Module, caplog: Any) -> None:
    from dllm_train.checkpointing import resume_checkpoint

    paths = _three(tmp_path, tiny_llada)
    target = paths[-1] / torn
    if torn == "manifest.json":  # no manifest, and a torn weights file: what an incomplete copy leaves
        target.unlink()
        _truncate(next((paths[-1] / "model").glob("*.safetensors")))
    else:
        _truncate(target if target.exists() else next((paths[-1] / "model").glob("*.safetensors")))
    with caplog.at_level("WARNING"):  # a folder without a manifest is read only when trusted (issue #38 T7)
        ref, state = resume_checkpoint(tmp_path, tiny_llada, trust_legacy=torn == "manifest.json")
    assert ref is not None and ref.step == 2 and state == {"step": 2}
    aside = [p.name for p in (tmp_path / "checkpoints").iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("0-rl-000003.damaged-")  # renamed, not deleted
    lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(lines) == 1 and "0-rl-000003" in lines[0]


def test_a_checkpoint_without_manifest_is_refused_unless_trusted(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    # issue #38 T7: a folder without a manifest was accepted as one written before manifests, so a
    # run folder from elsewhere resumed unverified. Now it takes trust_legacy (--trust-legacy-checkpoint).
    from dllm_train import LegacyCheckpointRefused, Run
    from dllm_train.checkpointing import resume_checkpoint

    paths = _three(tmp_path, tiny_llada)
    (paths[-1] / "manifest.json").unlink()
    before = {k: v.clone() for k, v in tiny_llada.state_dict().items()}
    with pytest.raises(LegacyCheckpointRefused, match=r"0-rl-000003 has no manifest.json.*--trust-legacy-checkpoint"):
        Run(tmp_path, tiny_llada, progress=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [p.name for p in paths]  # none set aside
    assert all(torch.equal(before[k], v) for k, v in tiny_llada.state_dict().items())  # nothing loaded
    assert latest_checkpoint(tmp_path).step == 2  # type: ignore[union-attr]
    # trusted: renamed into place whole when it was written, so verified by reading it
    ref, state = resume_checkpoint(tmp_path, tiny_llada, trust_legacy=True)
    assert ref is not None and ref.step == 3 and state == {"step": 3}


class _Payload:
    """Runs code when unpickled."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (print, ("unpickled: code ran",))


def test_a_trainer_state_is_never_unpickled(tmp_path: Path, tiny_llada: torch.nn.Module,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # issue #38 T7: trainer_state.pt was read with torch.load(weights_only=False): a run folder from
    # elsewhere could run code when resumed. Its manifest is rewritten, as a forger would.
    from dllm_train.checkpointing import resume_checkpoint, write_manifest

    paths = _three(tmp_path, tiny_llada)
    torch.save({"owner": {}, "results": {}, "x": _Payload()}, paths[-1] / "trainer_state.pt")
    write_manifest(paths[-1])
    with pytest.raises(ValueError, match=r"trainer_state.pt holds objects other than tensors and plain data"):
        resume_checkpoint(tmp_path, tiny_llada)
    assert "code ran" not in capsys.readouterr().out
    assert (paths[-1]).is_dir()  # refused, not set aside: a rerun does not silently resume from an older one


def test_a_checksum_mismatch_of_a_small_file_is_damage(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    from dllm_train.checkpointing import damage

    paths = _three(tmp_path, tiny_llada)
    cfg = paths[-1] / "model" / "config.json"
    cfg.write_text(cfg.read_text().replace("{", "[", 1))  # same size, other bytes
    assert "checksum" in str(damage(paths[-1]))
    assert latest_checkpoint(tmp_path) is not None and latest_checkpoint(tmp_path).step == 2  # type: ignore[union-attr]


def test_leftovers_of_killed_writes_and_deletions_are_cleaned_at_the_next_start(
        tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    from dllm_train.checkpointing import recover_checkpoints

    _three(tmp_path, tiny_llada)
    root = tmp_path / "checkpoints"
    (root / ".tmp-x1y2").mkdir()  # kill -9 inside a write
    (root / ".tmp-x1y2" / "trainer_state.pt").write_bytes(b"12")
    (root / ".deleting-0-rl-000000-77").mkdir()  # kill -9 inside a deletion
    ref = recover_checkpoints(tmp_path)
    assert ref is not None and ref.step == 3
    assert sorted(p.name for p in root.iterdir()) == ["0-rl-000001", "0-rl-000002", "0-rl-000003"]


def test_pruning_goes_through_a_rename(tmp_path: Path, tiny_llada: torch.nn.Module, monkeypatch: Any) -> None:
    # a crash while an old checkpoint is deleted must not leave a half-deleted folder under its name
    import shutil

    import dllm_train.checkpointing as ck

    seen: list[str] = []
    real = shutil.rmtree

    def watch(path: Any, *a: Any, **k: Any) -> None:
        seen.append(Path(path).name)
        real(path, *a, **k)

    monkeypatch.setattr(ck.shutil, "rmtree", watch)
    for s in (1, 2):
        save_checkpoint(tmp_path, order=0, phase="rl", step=s, model=tiny_llada, state={}, keep=1)
    assert seen and all(n.startswith(".deleting-") for n in seen)


def test_every_checkpoint_has_a_manifest_of_its_files(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    import json

    path = save_checkpoint(tmp_path, order=0, phase="rl", step=1, model=tiny_llada, state={})
    files = json.loads((path / "manifest.json").read_text())["files"]
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(files) == on_disk and all(files[n]["size"] == (path / n).stat().st_size for n in files)
    assert "sha256" in files["model/config.json"] and "trainer_state.pt" in files


def test_a_torn_ray_shard_makes_the_checkpoint_damaged(tmp_path: Path, tiny_llada: torch.nn.Module) -> None:
    # Ray's ranks write shards/ inside the temporary folder: the manifest, written after them, covers them
    from dllm_train.checkpointing import SHARDS, new_checkpoint, resume_checkpoint, write_checkpoint_files

    for step in (1, 2):
        with new_checkpoint(tmp_path, order=0, phase="rl", step=step, keep=3) as folder:
            (folder / SHARDS).mkdir()
            (folder / SHARDS / "__0_0.distcp").write_bytes(bytes(4096))
            write_checkpoint_files(folder, model=tiny_llada, state={"step": step})
    _truncate(tmp_path / "checkpoints" / "0-rl-000002" / SHARDS / "__0_0.distcp")
    ref, state = resume_checkpoint(tmp_path, tiny_llada)
    assert ref is not None and ref.step == 1 and state == {"step": 1}


def test_leftovers_of_a_killed_export_are_cleaned_at_the_next_start(
        tmp_path: Path, tiny_llada: torch.nn.Module, monkeypatch: Any) -> None:
    # issue #38 T2: kill -9 during the final model/ export left `.model.tmp-*` (a full model copy)
    # and `.model.old-*` in the run folder for ever. The kill is stood in for by an export whose
    # cleanup never runs: the old folder renamed aside, the new one not yet renamed into place.
    import dllm_models.checkpoint as mc
    from dllm_models import save_model
    from dllm_train.checkpointing import recover_checkpoints

    save_model(tiny_llada, tmp_path / "model")
    real_replace, calls = mc.os.replace, []

    def killed(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies between the two renames
        real_replace(src, dst)

    monkeypatch.setattr(mc.os, "replace", killed)
    monkeypatch.setattr(mc.shutil, "rmtree", lambda *a, **k: None)  # nothing runs after a kill
    with pytest.raises(KeyboardInterrupt):
        save_model(tiny_llada, tmp_path / "model")
    monkeypatch.undo()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".model."))
    assert [re.sub(r"-.*", "-*", n) for n in left] == [".model.old-*", ".model.tmp-*"]
    (tmp_path / ".config.json.tmp").write_text("{}")  # not an export's leftover: kept
    (tmp_path / "model.bak").mkdir()
    _three(tmp_path, tiny_llada)
    ref = recover_checkpoints(tmp_path)  # what a run does when it starts
    assert ref is not None and ref.step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [".config.json.tmp", "checkpoints", "model.bak"]
