"""Benchmark registry, shipped data and presets."""

from __future__ import annotations

import dataclasses

import pytest

from dllm_eval import (
    BENCHMARKS,
    DATASETS,
    PRESETS,
    Preset,
    get_benchmark,
    get_preset,
)
from dllm_eval.data import load_rows
from dllm_rollout import SamplingConfig
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
    assert gsm.decoding("dare_local") == SamplingConfig(max_new_tokens=512, steps=512,
                                                        block_length=32, cache="prefix")
    assert gsm.decoding("d1").steps == 128
    assert get_benchmark("sudoku").decoding("dare_local").max_new_tokens == 256
    assert set(PRESETS) >= {"dare_local", "d1", "d1_128", "d1_512", "dare_opencompass"}


def test_mbpp_keeps_reference_layout() -> None:
    row = get_benchmark("mbpp").load(limit=1)[0]
    roles = [m["role"] for m in row.prompt]
    assert roles == ["user", "assistant"] * 4 and row.prompt[-1]["content"] == "[BEGIN]\n"


def test_benchmark_reward_uses_preset_extraction() -> None:
    gsm = get_benchmark("gsm8k")
    row = gsm.load(limit=1)[0]
    plain = f"The answer is {row.ground_truth}"
    assert gsm.reward(plain, row, "dare_local").score == 0.0  # DARE: \boxed or nothing
    assert gsm.reward(plain, row, "d1", mode="default").score == 1.0  # last_number extraction
    assert gsm.reward(plain, row, "d1").score == 0.0  # d1's parser: \boxed or <answer> only
    assert gsm.reward(f"<answer>{plain}</answer>", row, "d1").score == 1.0


def test_decoding_validation() -> None:
    with pytest.raises(ValueError, match="block_length"):
        SamplingConfig(max_new_tokens=100, steps=100, block_length=32)
    with pytest.raises(ValueError, match="remasking"):
        SamplingConfig(max_new_tokens=64, steps=64, block_length=32, remasking="x")  # type: ignore[arg-type]


def test_d1_presets_follow_d1_eval() -> None:
    for name, length in (("d1_128", 128), ("d1", 256), ("d1_512", 512)):
        d = get_benchmark("gsm8k").decoding(name)
        assert (d.max_new_tokens, d.steps, d.block_length, d.temperature, d.cache) == (
            length, length // 2, 32, 0.0, None)
        assert get_preset(name).assistant_prefill == "<reasoning>"
    cd = get_benchmark("countdown")
    row = cd.load(limit=1)[0]
    text = cd.messages(row, "d1")[0]["content"]
    assert text.endswith("</answer>\n\nNumbers: [30, 100, 93]\nTarget: 23")
    assert "provide only your final expression inside \\boxed{} tags" in text
    math = get_benchmark("math500")
    mrow = math.load(limit=1)[0]
    assert math.messages(mrow, "d1")[0]["content"].endswith(
        '</answer>" \n\n\n' + mrow.prompt[0]["content"])  # d1's MATH-500 prompt, stray quote


def test_d1_sudoku_subset_is_seed_42_draw() -> None:
    np = pytest.importorskip("numpy")
    np.random.seed(42)
    expected = np.random.choice(500, 256, replace=False).tolist()
    rows = get_benchmark("sudoku").load(preset="d1")
    assert [r.index for r in rows] == expected
    assert len(get_benchmark("countdown").load(preset="d1")) == 256  # all 256, as d1


def test_dare_opencompass_preset() -> None:
    gsm = get_benchmark("gsm8k")
    msgs = gsm.messages(gsm.load(limit=1)[0], "dare_opencompass")
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 4 + ["user"]
    assert msgs[-1]["content"].startswith("Question: Janet")
    assert msgs[-1]["content"].endswith("\nLet's think step by step\nAnswer:")
    assert gsm.decoding("dare_opencompass").block_length == 8
    assert get_benchmark("math500").decoding("dare_opencompass").block_length == 64
    aime = get_benchmark("aime2024").decoding("dare_opencompass")
    assert (aime.max_new_tokens, aime.block_length, aime.temperature) == (2048, 64, 1.0)
    assert get_preset("dare_opencompass").repeats["aime2024"] == 8


def test_dare_local_follows_the_local_bench_script() -> None:
    pre = get_preset("dare_local")
    assert pre.reward_mode == "dare" and pre.max_prompt_tokens == {"math": 512, "puzzle": 512,
                                                                    "code": 1024}
    dream = get_benchmark("math500").decoding("dare_local", family="dream")
    llada = get_benchmark("math500").decoding("dare_local", family="llada")
    assert (dream.temperature, dream.top_p, llada.temperature) == (0.2, 0.95, 0.0)
    assert get_benchmark("countdown").decoding("dare_local").max_new_tokens == 256
    with pytest.raises(ValueError, match="reward_mode"):
        Preset(name="x", decoding=pre.decoding, reward_mode="nope")


def test_a_block_model_decodes_a_preset_on_its_own_block_grid() -> None:
    from dllm_rollout import on_model_grid

    def for_model(cfg: SamplingConfig, block: int | None) -> SamplingConfig:
        return on_model_grid(cfg, block, convert=True)

    d1_like = SamplingConfig(max_new_tokens=256, steps=128, block_length=32)
    assert for_model(d1_like, None) == d1_like  # masked diffusion: as the preset says
    sdar = for_model(d1_like, 4)  # two tokens a step, as the preset: 2 steps per block of 4
    assert (sdar.max_new_tokens, sdar.block_length, sdar.steps, sdar.cache) == (256, 4, 2, "prefix")
    assert sdar.block_diffusion and not d1_like.block_diffusion
    llada2 = for_model(SamplingConfig(max_new_tokens=256, steps=256, block_length=8, cache="prefix"), 32)
    assert (llada2.block_length, llada2.steps, llada2.cache, llada2.block_diffusion) == (32, 32, "prefix", True)
    # a cache the preset names is kept, so a masked-diffusion cache is refused for a block model
    with pytest.raises(ValueError, match="cache='dual' is a masked-diffusion cache"):
        for_model(SamplingConfig(max_new_tokens=256, steps=256, block_length=8, cache="dual"), 32)
    # a preset on the model's own block still counts total steps: 256 steps of 256 tokens is one token a
    # step, 32 steps per block of 32 (before, it kept 256 "per block" and no cache)
    same_grid = for_model(SamplingConfig(max_new_tokens=256, steps=256, block_length=32), 32)
    assert (same_grid.steps, same_grid.cache, same_grid.block_diffusion) == (32, "prefix", True)
    # settings written for the block model keep their per-block steps; another block is refused unconverted
    native = SamplingConfig(max_new_tokens=64, steps=4, block_length=4, block_diffusion=True)
    assert on_model_grid(native, 4) == native and on_model_grid(native, 4, convert=True) == native
    with pytest.raises(ValueError, match="block_length=8 but the model decodes blocks of 4"):
        on_model_grid(SamplingConfig(max_new_tokens=64, steps=4, block_length=8, block_diffusion=True), 4,
                      convert=True)
    with pytest.raises(ValueError, match="block_length=32 but the model decodes blocks of 4"):
        on_model_grid(d1_like, 4)  # an evaluation preset must be converted explicitly
    assert not on_model_grid(dataclasses.replace(native, max_new_tokens=8, steps=2), None).block_diffusion


def test_opencompass_model_names_and_configs_carry_the_speed_section() -> None:
    """The speed switches never change a sample, so they do not rename an OpenCompass model; the decoding
    dict written into its config (with `speed`) reads back to the same SamplingConfig."""
    import dataclasses

    from dllm_eval.opencompass.configs import model_abbr
    from dllm_rollout import SamplingConfig, SpeedConfig, configure

    base = SamplingConfig(max_new_tokens=8, steps=8, block_length=8)
    slow = dataclasses.replace(base, speed=SpeedConfig(cuda_graphs=False, retire_rows=0))
    assert model_abbr("/ckpt/m", slow) == model_abbr("/ckpt/m", base) == "m_L8_S8_B8_T0"
    assert configure(None, **dataclasses.asdict(slow)) == slow
