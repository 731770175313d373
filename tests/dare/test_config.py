"""Run configs: dotted overrides, validation messages, JSON round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from dare.config import apply_overrides, load_config, save_config
from dare.recipes import get_recipe, quickstart


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
