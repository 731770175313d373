"""User errors end in one line, not a traceback, and before anything is written: partial checkpoint
folders, the wrong family, data files and columns, `dare eval` paths, Ctrl-C, out of GPU memory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import dare.quickstart
from dare.cli import main
from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_models import save_model
from tests.dare.helpers import tiny_config


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny LLaDA checkpoint, the same without weights and without tokenizer, and RL parquet files."""
    tok = build_tokenizer()
    root = tmp_path_factory.mktemp("inputs")
    save_model(build_tiny_model(tiny_config(), tok), root / "full", tokenizer=tok)
    shutil.copytree(root / "full", root / "no-weights")
    (root / "no-weights" / "model.safetensors").unlink()
    shutil.copytree(root / "full", root / "no-tokenizer")
    (root / "no-tokenizer" / "tokenizer.json").unlink()
    pq.write_table(pa.table({"question": ["1+1="], "answer": ["2"]}), root / "wrong.parquet")
    pq.write_table(pa.table({"prompt": [[{"role": "user", "content": "1+1="}]], "data_source": ["gsm8k"],
                             "ground_truth": ["2"]}), root / "rl.parquet")
    return {p.stem: p for p in root.iterdir()}


def _fails(args: list[str], capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    with pytest.raises(SystemExit) as err:
        main(args)
    assert err.value.code == code
    msg = capsys.readouterr().err
    assert "Traceback" not in msg
    return msg


def _rl(ckpt: Path, data: Path | str, out: Path, recipe: str = "llada-d1") -> list[str]:
    return ["train", recipe, f"checkpoint.checkpoint={ckpt}", f"data.train_files={data}", "--output-dir", str(out),
            "--no-progress"]


@pytest.mark.parametrize(("folder", "needle"), [
    ("no-weights", "has no weights"),
    ("no-tokenizer", "has no tokenizer"),
])
def test_partial_checkpoint_folder_fails_before_anything_is_written(
        folder: str, needle: str, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    msg = _fails(_rl(folders[folder], folders["rl"], tmp_path / "out"), capsys)
    assert needle in msg and "checkpoint.checkpoint=" in msg
    assert not (tmp_path / "out").exists()


def test_rl_data_with_wrong_columns_names_them(folders: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    msg = _fails(_rl(folders["full"], folders["wrong"], tmp_path / "out"), capsys)
    assert "missing ['prompt', 'data_source', 'ground_truth (or reward_model.ground_truth)']" in msg
    assert not (tmp_path / "out").exists()
    msg = _fails(_rl(folders["full"], tmp_path / "none.parquet", tmp_path / "out"), capsys)
    assert "is not a file nor one of the shipped datasets" in msg


def test_checkpoint_family_is_checked_against_the_checkpoint(folders: dict[str, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    msg = _fails(_rl(folders["full"], folders["rl"], tmp_path / "out", recipe="dream-d1"), capsys)
    assert "checkpoint.family='dream', but" in msg and "holds a 'llada' model" in msg
    assert not (tmp_path / "out").exists()


def test_eval_checks_its_paths_before_loading(folders: dict[str, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    msg = _fails(["eval", str(tmp_path), "--limit", "1"], capsys)
    assert "config.json not found" in msg
    file = tmp_path / "file"
    file.write_text("x")
    msg = _fails(["eval", str(folders["full"]), "--output-dir", str(file), "--limit", "1"], capsys)
    assert "is a file, not a folder" in msg


def test_ctrl_c_says_how_to_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dare.quickstart, "run_quickstart", interrupted)
    msg = _fails(["train", "trainer.max_steps=3", "--output-dir", str(tmp_path / "qs")], capsys, code=130)
    assert [line for line in msg.splitlines() if "dare:" in line] == [msg.strip().splitlines()[-1]]  # one line
    # nothing was checkpointed before the interrupt: the message says so and gives the rerun command
    assert "No checkpoint was written" in msg and "resumable" not in msg
    assert f"train trainer.max_steps=3 --output-dir {tmp_path / 'qs'}" in msg
    msg = _fails(["train", "trainer.max_steps=3"], capsys, code=130)  # a generated folder is named
    assert "--output-dir runs/quickstart-" in msg


def test_out_of_gpu_memory_names_the_knobs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def oom(*args: object, **kwargs: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(dare.quickstart, "run_quickstart", oom)
    msg = _fails(["train", "--output-dir", str(tmp_path / "qs")], capsys, code=1)
    for knob in ("trainer.max_tokens_per_pass", "rollout.max_rows", "trainer.activation_checkpointing",
                 "rl.prompts_per_step"):
        assert knob in msg


def test_eval_warns_when_the_model_cannot_read_the_prompts() -> None:
    from dare.inputs import eval_prompt_warnings, max_positions
    from dllm_eval import get_benchmark, get_preset

    tok = build_tokenizer()
    model = build_tiny_model(tiny_config(), tok)
    assert max_positions(model) == 64
    gsm8k, preset = get_benchmark("gsm8k"), get_preset("dare_local")
    warnings = eval_prompt_warnings(model, tok, gsm8k, preset, 512, limit=2)
    assert len(warnings) == 2
    assert "the tokenizer keeps only" in warnings[0] and "2 of 2 prompts plus max_new_tokens=512" in warnings[1]

    class Sums:  # a benchmark the addition tokenizer reads whole
        name = "sums"

        def load(self, *, limit: int | None, preset: object) -> list[int]:
            return [1, 2]

        def messages(self, row: int, preset: object) -> list[dict[str, str]]:
            return [{"role": "user", "content": f"{row}{row}+34="}]

    assert eval_prompt_warnings(model, tok, Sums(), preset, 8, limit=None) == []
