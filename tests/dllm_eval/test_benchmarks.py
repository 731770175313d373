"""Benchmark registry, shipped data and presets."""

from __future__ import annotations

import pytest

from dllm_eval import BENCHMARKS, DATASETS, PRESETS, DecodingSettings, get_benchmark, get_preset
from dllm_eval.data import load_rows
from dllm_eval.presets import D1_MATH_SYSTEM_PROMPT

EXPECTED_ROWS = {"gsm8k": 1319, "math500": 500, "countdown": 256, "sudoku": 500,
                 "humaneval": 164, "humanevalplus": 163, "mbpp": 500, "aime2024": 30,
                 "aime2025": 30}


@pytest.mark.parametrize("name", DATASETS)
def test_shipped_data_is_complete(name: str) -> None:
    rows = load_rows(name)
    assert len(rows) == EXPECTED_ROWS[name]
    assert rows[0].prompt and rows[0].ground_truth and rows[0].data_source == name


def test_registry_matches_data() -> None:
    assert set(BENCHMARKS) == set(DATASETS)
    with pytest.raises(ValueError, match="valid"):
        get_benchmark("mmlu")
    with pytest.raises(ValueError, match="valid"):
        get_preset("nope")
    with pytest.raises(ValueError, match="dataset"):
        load_rows("mmlu")


def test_presets_side_by_side() -> None:
    gsm = get_benchmark("gsm8k")
    row = gsm.load(limit=1)[0]
    dare = gsm.messages(row, "dare_local")
    d1 = gsm.messages(row, "d1")
    assert dare == [dict(m) for m in row.prompt]  # prompt as stored
    assert d1[0]["content"] == f"{D1_MATH_SYSTEM_PROMPT}\n\n{row.prompt[0]['content']}"
    assert gsm.decoding("dare_local") == DecodingSettings(max_new_tokens=512, steps=512,
                                                          block_length=32)
    assert gsm.decoding("d1").steps == 128
    assert get_benchmark("sudoku").decoding("dare_local").max_new_tokens == 256
    cd = get_benchmark("countdown")
    crow = cd.load(limit=1)[0]
    assert cd.messages(crow, "d1") == [dict(m) for m in crow.prompt]  # already d1-formatted
    assert set(PRESETS) >= {"dare_local", "d1"}


def test_mbpp_keeps_reference_layout() -> None:
    row = get_benchmark("mbpp").load(limit=1)[0]
    roles = [m["role"] for m in row.prompt]
    assert roles == ["user", "assistant"] * 4 and row.prompt[-1]["content"] == "[BEGIN]\n"


def test_benchmark_reward_uses_preset_extraction() -> None:
    gsm = get_benchmark("gsm8k")
    row = gsm.load(limit=1)[0]
    plain = f"The answer is {row.ground_truth}"
    assert gsm.reward(plain, row, "dare_local").score == 0.0
    assert gsm.reward(plain, row, "d1").score == 1.0


def test_decoding_validation() -> None:
    with pytest.raises(ValueError, match="block_length"):
        DecodingSettings(max_new_tokens=100, steps=100, block_length=32)
    with pytest.raises(ValueError, match="remasking"):
        DecodingSettings(max_new_tokens=64, steps=64, block_length=32, remasking="x")  # type: ignore[arg-type]
