"""Run configs: dotted overrides, validation messages, JSON round trip, sections per kind of run,
the typed algorithm section, and `dare show`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dare.cli import main
from dare.config import RunConfig, apply_overrides, load_config, save_config, to_dict
from dare.recipes import RECIPES, get_recipe, quickstart
from dare.show import field_docs
from dllm_algorithms import BGPO
from dllm_train import TrainerConfig


def test_overrides_reach_nested_fields_with_types() -> None:
    cfg = apply_overrides(quickstart(), ["trainer.max_steps=7", "rollout.temperature=0.5",
                                          "rl_optim.betas=[0.8, 0.9]", "rollout.threshold=none"])
    assert cfg.trainer.max_steps == 7 and cfg.rollout.temperature == 0.5
    assert cfg.rl_optim.betas == (0.8, 0.9) and cfg.rollout.threshold is None


def test_unknown_key_names_valid_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown config key 'trainer.max_stepz'.*max_steps"):
        apply_overrides(quickstart(), ["trainer.max_stepz=3"])


def test_bad_value_fails_with_field_name() -> None:
    with pytest.raises(ValueError, match="rl.group_size must be >= 2"):
        apply_overrides(quickstart(), ["rl.group_size=1"])
    with pytest.raises(ValueError, match="block_length"):
        apply_overrides(quickstart(), ["rollout.block_length=3"])
    with pytest.raises(ValueError, match="trainer.max_steps: expected an integer"):
        apply_overrides(quickstart(), ["trainer.max_steps=2.5"])


def test_unknown_recipe_lists_recipes() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        get_recipe("nope")


def test_config_json_round_trip(tmp_path: Path) -> None:
    cfg = apply_overrides(quickstart(), ["sft.steps=11"])
    save_config(cfg, tmp_path / "c.json")
    assert load_config(tmp_path / "c.json") == cfg


def test_algorithm_section_is_an_ordinary_dotted_override() -> None:
    cfg = apply_overrides(get_recipe("llada-bgpo"), ["algorithm.mc_num=4", "algorithm.clip_high=0.28"])
    assert cfg.algorithm == BGPO(mc_num=4, clip_high=0.28)  # the entry the run trains with
    with pytest.raises(ValueError, match="algorithm.mc_num: expected an integer, got 'four'"):
        apply_overrides(cfg, ["algorithm.mc_num=four"])
    with pytest.raises(ValueError, match=r"unknown config key 'algorithm.mc_nm' \(did you mean 'algorithm.mc_num'\?\): "
                                         r"algorithm 'bgpo' has "
                                         r"\['clip_high', 'clip_low', 'dual_clip', 'mc_num'\]"):
        apply_overrides(cfg, ["algorithm.mc_nm=4"])
    with pytest.raises(ValueError, match="algorithm.num_iterations must be >= 1"):  # the entry's own validation
        apply_overrides(get_recipe("llada-espo"), ["algorithm.num_iterations=0"])


def test_algorithm_name_switches_the_section_to_its_defaults() -> None:
    cfg = apply_overrides(quickstart(), ["algorithm=bgpo", "algorithm.mc_num=2"])
    assert cfg.algorithm_name == "bgpo" and cfg.algorithm == BGPO(mc_num=2)
    assert apply_overrides(cfg, ["algorithm_name=d1"]).algorithm.clip_low == 0.2
    with pytest.raises(ValueError, match="algorithm 'nosuch' is unknown; choose one of the RL algorithms"):
        apply_overrides(quickstart(), ["algorithm=nosuch"])
    with pytest.raises(ValueError, match="not an RL algorithm"):
        apply_overrides(quickstart(), ["algorithm=vrpo"])
    with pytest.raises(ValueError, match=r"algorithm 'ebpo' is defined for \['sdar'.*not family 'llada'"):
        apply_overrides(quickstart(), ["algorithm=ebpo"])  # block families only; the tiny model is LLaDA
    with pytest.raises(ValueError, match="is a preference recipe.*not rl, rl_optim.*such as llada-vrpo"):
        apply_overrides(get_recipe("llada-d1"), ["algorithm=vrpo"])


def test_clip_settings_live_on_the_algorithm_only() -> None:
    with pytest.raises(ValueError, match=r"unknown config key 'rl.clip_low': RLConfig has \['group_size'"):
        apply_overrides(quickstart(), ["rl.clip_low=0.1"])
    assert apply_overrides(quickstart(), ["algorithm.clip_low=0.1"]).algorithm.clip_low == 0.1


def test_a_run_has_only_the_sections_of_its_kind(tmp_path: Path) -> None:
    assert {"task", "model", "sft", "eval"} <= set(to_dict(quickstart()))
    for name, keys in [("llada-d1", {"checkpoint", "data", "rl", "rl_optim"}),
                       ("llada-sft", {"checkpoint", "data", "sft", "sft_optim"}),
                       ("llada-vrpo", {"checkpoint", "data", "preference", "preference_optim"})]:
        save_config(get_recipe(name), tmp_path / f"{name}.json")
        saved = json.loads((tmp_path / f"{name}.json").read_text())
        assert set(saved) == {"recipe", "algorithm_name", "algorithm", "rollout", "kernels", "trainer", *keys}, name
    with pytest.raises(ValueError, match="config key 'preference.pairs_per_step': recipe 'llada-d1' is an RL "
                                         "recipe, which has no 'preference' section"):
        apply_overrides(get_recipe("llada-d1"), ["preference.pairs_per_step=8"])
    with pytest.raises(ValueError, match="config key 'task.digits': recipe 'llada-sft' is an SFT recipe"):
        apply_overrides(get_recipe("llada-sft"), ["task.digits=2"])


def test_sft_loss_settings_have_one_home() -> None:
    cfg = get_recipe("llada-lora-sft")
    assert set(to_dict(cfg)["algorithm"]) == {"t_range"}
    with pytest.raises(ValueError, match="set sft.normalizer instead"):
        apply_overrides(cfg, ["algorithm.normalizer=response"])
    with pytest.raises(ValueError, match="set checkpoint.lora_rank and checkpoint.lora_alpha instead"):
        apply_overrides(cfg, ["algorithm.lora=null"])
    cfg = apply_overrides(cfg, ["sft.normalizer=response", "checkpoint.lora_rank=4"])
    assert cfg.algorithm.normalizer == "response" and cfg.algorithm.lora.rank == 4


@pytest.mark.parametrize("name", ["quickstart", "llada-bgpo", "llada2-lora-sft", "dream-vrpo"])
def test_every_kind_round_trips_through_config_json(name: str, tmp_path: Path) -> None:
    cfg = apply_overrides(get_recipe(name), ["trainer.seed=3"])
    if cfg.kind in ("rl", "quickstart"):
        cfg = apply_overrides(cfg, ["algorithm.clip_low=0.1"])
    save_config(cfg, tmp_path / "c.json")
    again = load_config(tmp_path / "c.json")
    assert again == cfg
    save_config(again, tmp_path / "d.json")
    assert (tmp_path / "d.json").read_text() == (tmp_path / "c.json").read_text()


def test_config_json_of_the_string_algorithm_era_still_loads(tmp_path: Path) -> None:
    data = to_dict(quickstart())
    del data["algorithm_name"]
    data["algorithm"] = "bgpo"
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_config(tmp_path / "old.json").algorithm == BGPO()


def test_train_config_repeats_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dare.quickstart

    seen: list[RunConfig] = []
    monkeypatch.setattr(dare.quickstart, "run_quickstart", lambda cfg, *a, **k: seen.append(cfg) or {
        "eval_accuracy_before_rl": 0.0, "eval_accuracy_after_rl": 0.0, "num_eval_prompts": 1})
    first = apply_overrides(quickstart(), ["algorithm=bgpo", "algorithm.mc_num=2", "rl_optim.lr=1e-5"])
    save_config(first, tmp_path / "config.json")
    assert main(["train", "--config", str(tmp_path / "config.json"), "--output-dir", str(tmp_path / "run")]) == 0
    assert seen == [first]


def test_field_docs_read_the_attributes_sections() -> None:
    docs = field_docs(TrainerConfig)
    assert docs["max_steps"] == "number of optimizer steps of the RL phase."
    assert docs["num_threads"].startswith("torch CPU threads of this process (0 keeps torch's default). Tiny")
    from dare.config import TinyModelConfig

    assert field_docs(TinyModelConfig)["n_heads"] == "shape."  # `d_model, n_layers, n_heads, ...: shape.`


def test_show_and_train_help_list_every_field_with_its_value_and_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "llada-bgpo", "algorithm.mc_num=4"]) == 0
    out = capsys.readouterr().out
    assert "LLaDA (masked diffusion), RL: BGPO" in out.splitlines()[0]
    fields_part = out.split("\nsources:")[0]  # then each default's source line (its quote may hold " = ")
    assert "\nsources:" in out
    lines = {line.split("=")[0].strip(): line for line in fields_part.splitlines() if " = " in line}
    assert lines["algorithm.mc_num"].split("=")[1].split()[0] == "4"
    assert "Monte-Carlo masks per sequence" in lines["algorithm.mc_num"]  # the algorithm class's own doc
    assert "learning rate" in lines["rl_optim.lr"] and "5e-07" in lines["rl_optim.lr"]
    assert "number of optimizer steps" in lines["trainer.max_steps"]
    cfg = to_dict(apply_overrides(get_recipe("llada-bgpo"), ["algorithm.mc_num=4"]))

    def leaves(tree: dict[str, Any], prefix: str = "") -> set[str]:
        return {k for key, v in tree.items()
                for k in (leaves(v, f"{prefix}{key}.") if isinstance(v, dict) else {f"{prefix}{key}"})}

    assert set(lines) == leaves(cfg)  # every field, nothing else (no quick-start task or model)
    # the speed switches are fields with their defaults and docs: the decoder's and the model's
    assert "true" in lines["rollout.speed.cuda_graphs"] and "CUDA graphs" in lines["rollout.speed.cuda_graphs"]
    assert lines["rollout.speed.retire_rows"].split("=")[1].split()[0] == "16"
    assert "true" in lines["kernels.decode_span"] and "visible column range" in lines["kernels.decode_span"]
    assert "fused Triton kernels" in lines["kernels.fused"]
    assert main(["train", "llada-vrpo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--output-dir" in out and "preference.pairs_per_step = 64" in out and "algorithm.beta = 0.2" in out


def test_every_recipe_shows(capsys: pytest.CaptureFixture[str]) -> None:
    for name in RECIPES:
        assert main(["show", name]) == 0, name
    assert "task.digits = 3" in capsys.readouterr().out


def test_more_denoising_steps_than_tokens_is_refused() -> None:
    # before: dream-d1 rollout.max_new_tokens=16 kept the recipe's 256 steps: 240 forwards unmasking nothing
    with pytest.raises(ValueError, match=r"^rollout.steps=256 exceeds rollout.max_new_tokens=16: .* set "
                                         r"rollout.steps=16 \(one token per step\) or fewer$"):
        apply_overrides(get_recipe("dream-d1"), ["rollout.max_new_tokens=16", "rollout.block_length=16"])
    cfg = apply_overrides(get_recipe("dream-d1"), ["rollout.max_new_tokens=16", "rollout.block_length=16",
                                                   "rollout.steps=16"])
    assert cfg.rollout.steps == 16
    with pytest.raises(ValueError, match=r"^rollout.steps=5 exceeds rollout.block_length=4"):  # per block
        apply_overrides(get_recipe("sdar-bgpo"), ["rollout.steps=5"])


def test_the_speed_switches_are_config_that_reaches_every_rank(tmp_path: Path) -> None:
    """`kernels.*` and `rollout.speed.*` are dotted overrides, written to config.json and read back, and a
    Ray rank (which receives the pickled config and builds its own model) runs with them."""
    import pickle

    from dare.quickstart import build_tiny_model, rank_setup
    from dare.tasks.addition import build_tokenizer
    from dllm_models import KernelConfig
    from dllm_rollout import SpeedConfig

    cfg = apply_overrides(quickstart(), ["kernels.decode_span=false", "kernels.decode_splits=2",
                                         "kernels.flex_kernel_options=[[\"BLOCK_M\", 64], [\"BLOCK_N\", 64]]",
                                         "rollout.speed.cuda_graphs=false", "rollout.speed.retire_rows=0"])
    assert cfg.kernels == KernelConfig(decode_span=False, decode_splits=2,
                                       flex_kernel_options=(("BLOCK_M", 64), ("BLOCK_N", 64)))
    assert cfg.rollout.speed == SpeedConfig(cuda_graphs=False, retire_rows=0)
    save_config(cfg, tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["kernels"]["decode_splits"] == 2 and saved["rollout"]["speed"]["retire_rows"] == 0
    assert load_config(tmp_path / "config.json") == cfg
    shipped = pickle.loads(pickle.dumps(cfg))  # what Ray hands a rank
    setup = rank_setup(shipped, build_tiny_model(cfg, build_tokenizer()).state_dict())
    assert setup.model.kernels == cfg.kernels and setup.sampling.speed == cfg.rollout.speed
    with pytest.raises(ValueError, match=r"kernels\.decode_block_n must be a power of two"):
        apply_overrides(quickstart(), ["kernels.decode_block_n=100"])
