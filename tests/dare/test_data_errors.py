"""Data errors (issue #25 item 5, #28 item 4): one `dare: error:` line naming the file, the row and
the column, before anything is written and before the model loads. Each case below reproduced a
fault of #25's table first: null ground_truth became the string "None", a null prompt was a
TypeError traceback, a plain-string prompt `Expecting value`, an unknown data_source was caught
after the model load and a rollout, an empty file was told to "raise max lengths", and a
non-parquet file got pyarrow's error without its name."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dare.offline_pipeline
import dare.pipeline
from dare.cli import main
from dare.quickstart import build_tiny_model
from dare.rl_data import encode_prompts, read_rl_rows
from dare.tasks.addition import build_tokenizer
from dllm_models import save_model
from tests.dare.helpers import tiny_config

TOK = build_tokenizer()
MESSAGE = [{"role": "user", "content": "12+34="}]


def _rl(**columns: list[Any]) -> pa.Table:
    """A 2-row RL table: every column valid unless given."""
    base: dict[str, list[Any]] = {"prompt": [MESSAGE, MESSAGE], "data_source": ["gsm8k", "gsm8k"],
                                  "reward_model": [{"ground_truth": "46"}, {"ground_truth": "46"}]}
    return pa.table({**base, **columns})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLaDA checkpoint folder (64 positions) with the addition tokenizer."""
    path = tmp_path_factory.mktemp("data-errors") / "llada"
    save_model(build_tiny_model(tiny_config(), TOK), path, tokenizer=TOK)
    return path


@pytest.fixture(autouse=True)
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every error here must come before the policy's weights load."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the data were checked")

    monkeypatch.setattr(dare.pipeline, "load_policy", refuse)  # (policy_with_adapters loads through it)


def _write(tmp_path: Path, table: pa.Table, name: str = "d.parquet") -> Path:
    path = tmp_path / name
    pq.write_table(table, path)
    return path


def _fails(capsys: pytest.CaptureFixture[str], ckpt: Path, data: Path | str, out: Path, recipe: str = "llada-d1",
           *extra: str) -> str:
    """The one error line of `dare train RECIPE` on `data`; the output folder stays unwritten."""
    args = ["train", recipe, f"checkpoint.checkpoint={ckpt}", f"data.train_files={data}", "checkpoint.dtype=float32",
            "rollout.max_new_tokens=8", "rollout.steps=8", "rollout.block_length=8", *extra,
            "--output-dir", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as err:
        main(args)
    assert err.value.code == 2
    err_text = capsys.readouterr().err
    assert "Traceback" not in err_text
    lines = [line for line in err_text.splitlines() if "output folder:" not in line]  # the log's first line
    assert len(lines) == 1 and lines[0].startswith("dare: error: ")
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(("columns", "needle"), [
    ({"reward_model": [{"ground_truth": "46"}, {"ground_truth": None}]},
     "row 1, column 'reward_model.ground_truth': is null"),
    ({"reward_model": [{"ground_truth": "46"}, None]}, "row 1, column 'reward_model': is null"),
    ({"reward_model": [{"ground_truth": "46"}, {"ground_truth": "  "}]},
     "row 1, column 'reward_model.ground_truth': is empty"),
    ({"prompt": [MESSAGE, None]}, "row 1, column 'prompt': is null"),
    ({"prompt": [MESSAGE, []]}, "row 1, column 'prompt': must be text or a non-empty list"),
    ({"prompt": ["12+34=", ""]}, "row 1, column 'prompt': is empty"),
    ({"prompt": [MESSAGE, [{"role": "user", "content": ""}]]}, "row 1, column 'prompt': is empty"),
    ({"data_source": ["gsm8k", None]}, "row 1, column 'data_source': is null"),
    ({"data_source": ["gsm8k", "gsm8kk"]}, "row 1, column 'data_source': 'gsm8kk' (1 row(s)) is scored by no "
                                           "verifier (did you mean 'gsm8k'?); known data sources: ["),
])
def test_rl_cells_are_named_before_the_model_loads(columns: dict[str, list[Any]], needle: str, ckpt: Path,
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path, _rl(**columns))
    msg = _fails(capsys, ckpt, data, tmp_path / "out")
    assert f"{data} {needle}" in msg


@pytest.mark.parametrize(("source", "truth", "extra", "needle"), [
    ("mbpp", "assert f(1) == 2", None, "'assert f(1) == 2' is not JSON (Expecting value: line 1 column 1"),
    ("mbpp", '{"assert": 1}', None, "is JSON of another shape (dict); its reward reads a non-empty JSON list"),
    ("kodcode", "[]", None, "is JSON of another shape (list)"),
    ("humaneval", "def check(candidate:\n    pass", None, "is not Python source ("),
    ("apps", "not json", None, "cannot be read as input/output tests ("),
    ("countdown", "twelve", '{"numbers": [3, 4]}', "'twelve' is not a number"),
    ("countdown", "12", '{"numbers": "[3, x]"}', "comes with extra_info['numbers'] = '[3, x]', not a list"),
])
def test_a_ground_truth_its_reward_cannot_read_is_named_before_the_model_loads(
        source: str, truth: str, extra: str | None, needle: str, ckpt: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # issue #38 T10: an mbpp row whose tests were not JSON passed the data checks, then stopped the
    # run after the model load and a rollout with a bare `Expecting value: line 1 column 1`
    good = {"mbpp": '["assert f(1) == 2"]', "kodcode": '["assert g() is None"]', "humaneval": "def check(c):\n    pass",
            "apps": '{"inputs": ["1"], "outputs": ["2"]}', "countdown": "7"}[source]
    columns: dict[str, list[Any]] = {"data_source": [source, source],
                                     "reward_model": [{"ground_truth": good}, {"ground_truth": truth}]}
    if source == "countdown":
        columns["extra_info"] = ['{"numbers": [3, 4]}', extra]
    data = _write(tmp_path, _rl(**columns))
    msg = _fails(capsys, ckpt, data, tmp_path / "out")
    assert f"{data} row 1, column 'reward_model.ground_truth' (data_source {source!r}): " in msg
    assert needle in msg and msg.endswith("Fix the row or drop it")


def test_flat_ground_truth_null_is_not_the_string_none(tmp_path: Path) -> None:
    table = pa.table({"prompt": [MESSAGE, MESSAGE], "data_source": ["gsm8k"] * 2, "ground_truth": ["46", None]})
    with pytest.raises(ValueError, match=r"row 1, column 'ground_truth': is null"):
        read_rl_rows(str(_write(tmp_path, table)))


def test_plain_string_prompts_are_one_user_message(tmp_path: Path) -> None:
    import json

    table = pa.table({"prompt": ["12+34=", json.dumps(MESSAGE)], "data_source": ["gsm8k"] * 2,
                      "ground_truth": [46, 46]})
    rows = read_rl_rows(str(_write(tmp_path, table)))
    assert [r.prompt for r in rows] == [tuple(MESSAGE), tuple(MESSAGE)]  # text, and messages as JSON text
    assert [r.ground_truth for r in rows] == ["46", "46"]  # an integer answer reads as its text


def test_an_empty_file_has_no_rows(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path, _rl().slice(0, 0))
    msg = _fails(capsys, ckpt, data, tmp_path / "out")
    assert f"data.train_files entry {str(data)!r} has no rows" in msg and "raise" not in msg


def test_a_non_parquet_file_is_named_with_its_key(ckpt: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d.csv"
    data.write_text("prompt,data_source,ground_truth\n12+34=,gsm8k,46\n")
    msg = _fails(capsys, ckpt, data, tmp_path / "out")
    assert f"data.train_files entry {str(data)!r} is not a parquet file" in msg


def test_a_folder_is_reported_as_a_folder(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    _write(folder, _rl(), "part-0.parquet")
    msg = _fails(capsys, ckpt, folder, tmp_path / "out")
    assert f"data.train_files entry {str(folder)!r} is a folder, not a parquet file (it holds 1:" in msg
    assert "part-0.parquet" in msg


def test_prompts_over_the_positions_are_dropped_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    from dllm_eval import Row

    short, long_ = (Row(index=i, data_source="gsm8k", prompt=({"role": "user", "content": text},), ground_truth="1")
                    for i, text in enumerate(["1+1=", "1" * 60 + "+1="]))
    caplog.set_level(logging.WARNING)
    kept = encode_prompts([short, long_, short], TOK, 512, positions=64, max_new_tokens=16)
    assert [row.index for _, row in kept] == [0, 0]
    assert ("dropped 1 of 3 prompts (1 whose prompt + rollout.max_new_tokens=16 exceed the checkpoint's 64 "
            "positions (config.json))") in caplog.text
    with pytest.raises(ValueError, match=r"none of the 1 prompts can be used \(1 whose prompt \+ "
                                         r"rollout.max_new_tokens=16 exceed the checkpoint's 64 positions"):
        encode_prompts([long_], TOK, 512, positions=64, max_new_tokens=16)


def test_prompts_too_long_for_the_model_fail_before_it_loads(ckpt: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path, _rl())  # 12+34= in the chat template fits 64 positions, but not with 60 new tokens
    msg = _fails(capsys, ckpt, data, tmp_path / "out", "llada-d1", "rollout.max_new_tokens=60",
                 "rollout.steps=60", "rollout.block_length=60")
    assert "none of the 2 prompts can be used (2 whose prompt + rollout.max_new_tokens=60 exceed the " \
           "checkpoint's 64 positions" in msg


def _sft(tmp_path: Path, **columns: list[Any]) -> Path:
    return _write(tmp_path, pa.table({"prompt": ["12+34=", "1+1="], "response": ["046", "002"], **columns}))


@pytest.mark.parametrize(("columns", "needle"), [
    ({"response": ["046", None]}, "row 1, column 'response': is null"),
    ({"response": ["046", ""]}, "row 1, column 'response': is empty"),
    ({"prompt": [None, "1+1="]}, "row 0, column 'prompt': is null"),
])
def test_sft_cells_are_named(columns: dict[str, list[Any]], needle: str, ckpt: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    data = _sft(tmp_path, **columns)
    msg = _fails(capsys, ckpt, data, tmp_path / "out", "llada-sft", "sft.steps=1")
    assert f"{data} {needle}" in msg


def test_an_empty_sft_file_is_not_told_to_raise_max_lengths(ckpt: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path, pa.table({"prompt": pa.array([], pa.string()), "response": pa.array([], pa.string())}))
    msg = _fails(capsys, ckpt, data, tmp_path / "out", "llada-sft", "sft.steps=1")
    assert "has no rows" in msg and "raise" not in msg and "max_" not in msg


def test_sft_rows_over_the_positions_fail_before_anything_is_written(ckpt: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    data = _sft(tmp_path, response=["0" * 70, "0" * 70])  # fits data.max_response_length, not 64 positions
    msg = _fails(capsys, ckpt, data, tmp_path / "out", "llada-sft", "sft.steps=1")
    assert "none of the 2 SFT rows can be used (2 whose prompt + response exceed the checkpoint's 64 positions" in msg


def test_preference_empty_chosen_is_named(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path, pa.table({"prompt": ["1+1=", "2+2="], "chosen": ["002", ""], "rejected": ["9", "8"]}))
    msg = _fails(capsys, ckpt, data, tmp_path / "out", "llada-dpo")
    assert f"{data} row 1, column 'chosen': is empty" in msg


def test_sft_folder_and_non_parquet_inputs(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "sft.jsonl"
    text.write_text('{"prompt": "1+1=", "response": "002"}\n')
    msg = _fails(capsys, ckpt, text, tmp_path / "out", "llada-sft", "sft.steps=1")
    assert f"data.train_files entry {str(text)!r} is not a parquet file" in msg
    folder = tmp_path / "dir"
    folder.mkdir()
    msg = _fails(capsys, ckpt, folder, tmp_path / "out", "llada-sft", "sft.steps=1")
    assert f"data.train_files entry {str(folder)!r} is a folder, not a parquet file;" in msg
    shutil.rmtree(folder)
