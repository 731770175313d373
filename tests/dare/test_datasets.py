"""SFT and preference parquet schemas, tokenisation and per-step batches."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dare.datasets import (
    PreferenceExample,
    SFTExample,
    encode_preference,
    encode_sft,
    preference_batch,
    read_preference_rows,
    read_sft_rows,
    sft_batch,
    step_indices,
)
from dare.tasks.addition import build_tokenizer

TOK = build_tokenizer()  # characters 0-9 + = (ids 0-11), EOS 12, mask 13; plain concatenating chat template


def test_verl_sft_layout_reads_question_and_answer(tmp_path: Path) -> None:
    # the shipped gsm8k_train.parquet layout (docs/data.md#sft-parquet): the prompt column carries an instruction
    # the SFT prompt leaves out, the response is extra_info.answer
    path = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.table({
        "prompt": [[{"role": "user", "content": "1+1= Let's think step by step"}]],
        "extra_info": [{"question": "1+1=", "answer": "002", "index": 0, "split": "train"}],
    }), path)
    (row,) = read_sft_rows(str(path))
    assert row.prompt == [{"role": "user", "content": "1+1="}] and row.response == "002"


def test_flat_layout_reads_several_files_and_chat_prompts(tmp_path: Path) -> None:
    pq.write_table(pa.table({"prompt": ["1+1="], "response": ["002"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"prompt": [[{"role": "system", "content": "s"}, {"role": "user", "content": "2+2="}]],
                             "response": ["004"]}), tmp_path / "b.parquet")
    rows = read_sft_rows(f"{tmp_path / 'a.parquet'}, {tmp_path / 'b.parquet'}")
    assert [r.response for r in rows] == ["002", "004"] and len(rows[1].prompt) == 2


def test_wrong_cell_type_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["1+1=", "2+2="], "chosen": ["002", "004"], "rejected": ["9", None]}), path)
    with pytest.raises(ValueError, match=r"p.parquet row 1, column 'rejected': is null"):
        read_preference_rows(str(path))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data.train_files entry .*nope.parquet.* is not a file"):
        read_sft_rows(str(tmp_path / "nope.parquet"))


def test_sft_encoding_appends_eos_and_drops_overlong_rows(tmp_path: Path) -> None:
    pq.write_table(pa.table({"prompt": ["1+1=", "11+11="], "response": ["2", "22222"]}), tmp_path / "s.parquet")
    rows = read_sft_rows(str(tmp_path / "s.parquet"))
    (kept,) = encode_sft(rows, TOK, max_prompt_length=6, max_response_length=3)  # 2nd response + EOS is 6
    assert kept == SFTExample((1, 10, 1, 11), (2, TOK.eos_token_id))
    with pytest.raises(ValueError, match="data.max_prompt_length=1"):
        encode_sft(rows, TOK, max_prompt_length=1, max_response_length=8)


def test_preference_encoding_keeps_the_last_tokens() -> None:
    from dare.datasets import PreferenceRow

    row = PreferenceRow([{"role": "user", "content": "12+34="}], chosen="046", rejected="999")
    (ex,) = encode_preference([row], TOK, max_prompt_length=3, max_response_length=2)
    assert ex == PreferenceExample((3, 4, 11), (4, 6), (9, 9))


def test_step_indices_walk_seeded_epochs() -> None:
    first = [i for s in range(5) for i in step_indices(10, 4, s, seed=0, purpose="x")]  # 2 epochs
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:20]) == list(range(10))
    assert first[:10] != first[10:20]  # each epoch reshuffles
    assert step_indices(10, 4, 3, seed=0, purpose="x") == first[12:16]  # a function of the step alone
    assert step_indices(10, 4, 0, seed=1, purpose="x") != first[:4]


def test_sft_batch_pads_inside_attention_and_loss() -> None:
    ids, attn, resp = sft_batch([SFTExample((1, 2), (3, 12)), SFTExample((1,), (4, 5, 6, 12))], pad_id=12)
    # row 0: [1 2 | 3 12 | 12 pad]   row 1: [1 | 4 5 6 12]
    assert ids.tolist() == [[1, 2, 3, 12, 12], [1, 4, 5, 6, 12]]
    assert attn.all()
    assert resp.tolist() == [[False, False, True, True, True], [False, True, True, True, True]]


def test_preference_batch_pads_outside_attention() -> None:
    b = preference_batch([PreferenceExample((1, 2), (3,), (4, 5)), PreferenceExample((1,), (6, 7), (8,))], pad_id=12)
    assert b.chosen_ids.tolist() == [[1, 2, 3], [1, 6, 7]]
    assert b.rejected_ids.tolist() == [[1, 2, 4, 5], [1, 8, 12, 12]]
    assert b.rejected_attention.tolist() == [[True] * 4, [True, True, False, False]]
    assert b.rejected_response.tolist() == [[False, False, True, True], [False, True, False, False]]
    assert torch.equal(b.chosen_attention, torch.ones(2, 3, dtype=torch.bool))
