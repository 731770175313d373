"""One config class per kind of run: required sections (never None), and config.json files written
by dare before the classes were split (tests/dare/fixtures/config_json, written by main at 2dc790e)
still load, repeat and resume."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dare.cli import main
from dare.config import (
    KINDS,
    SECTIONS,
    PreferenceRecipeConfig,
    QuickstartConfig,
    RLRecipeConfig,
    RunConfig,
    SFTRecipeConfig,
    apply_overrides,
    load_config,
    save_config,
)
from dare.recipes import get_recipe
from dare.run_folder import check_run_folder

FIXTURES = Path(__file__).parent / "fixtures" / "config_json"
# fixture -> (its class, the recipe and overrides main resolved it from)
WRITTEN_BY_MAIN: dict[str, tuple[type[RunConfig], str, list[str]]] = {
    "llada-d1.json": (RLRecipeConfig, "llada-d1", ["trainer.max_steps=3", "checkpoint.checkpoint=ckpt",
                                                    "data.train_files=train.parquet"]),
    "llada-lora-sft.json": (SFTRecipeConfig, "llada-lora-sft", ["sft.steps=2", "sft.normalizer=response",
                                                                 "checkpoint.checkpoint=ckpt"]),
    "llada-vrpo.json": (PreferenceRecipeConfig, "llada-vrpo", ["preference.pairs_per_step=4"]),
    "quickstart.json": (QuickstartConfig, "quickstart", []),
}
# changed since main wrote the fixtures: fields added (a saved config lacks them and reads their
# defaults) and recipe values changed (the fixtures keep the old ones)
ADDED_SINCE: dict[str, dict[str, Any]] = {
    "trainer": {"optimizer_offload": False, "activation_memory_gib": 0.0, "save_rollouts_every": 0},
    # the speed switches, once environment variables (issue #37): their defaults are today's behaviour
    "rollout": {"speed": {"cuda_graphs": True, "fold_store": True, "retire_rows": 16, "fused_sampling": True},
                "block_aligned_budget": False, "commit_block_start": False},
    "kernels": {"fused": True, "decode_attention": True, "decode_span": True, "decode_splits": 1,
                "decode_max_rows": 64, "decode_block_n": 128, "decode_stages": 2, "flex_kernel_options": None,
                "bd3lm_backward": "one_launch", "bd3lm_dkdv_chunk": 16},
    "checkpoint": {"lora_dropout": 0.0},
}
RECIPES_CHANGED_SINCE = ["trainer.optimizer_offload=false"]  # on in the released-size recipes


def test_every_kind_has_its_sections_as_required_fields() -> None:
    for kind, cls in KINDS.items():
        names = {f.name for f in dataclasses.fields(cls)}
        assert names == {"recipe", "algorithm_name", "algorithm", "rollout", "kernels", "trainer", *SECTIONS[kind]}, kind
        hints = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        assert not [n for n in SECTIONS[kind] if "None" in hints[n]], kind  # no optional section
    with pytest.raises(TypeError, match="RunConfig is no kind of run"):
        RunConfig(recipe="x", algorithm_name="d1")


@pytest.mark.parametrize("name", sorted(WRITTEN_BY_MAIN))
def test_config_json_written_before_the_split_loads_as_its_kind(name: str, tmp_path: Path) -> None:
    cls, recipe, overrides = WRITTEN_BY_MAIN[name]
    cfg = load_config(FIXTURES / name)
    assert type(cfg) is cls
    # the recipes resolve as they did, but for what changed since
    assert cfg == apply_overrides(get_recipe(recipe), [*overrides, *RECIPES_CHANGED_SINCE])
    save_config(cfg, tmp_path / "again.json")  # and write the same file back, with the fields added since
    want = json.loads((FIXTURES / name).read_text())
    for section, added in ADDED_SINCE.items():
        if section == "checkpoint" and section not in want:  # (a kind without that section)
            continue
        assert not set(added) & set(want.get(section, {}))
        want.setdefault(section, {}).update(added)
    assert (tmp_path / "again.json").read_text() == json.dumps(want, indent=2, sort_keys=True)


@pytest.mark.parametrize("name", ["llada-d1.json", "llada-lora-sft.json"])
def test_a_run_folder_written_before_the_split_resumes(name: str, tmp_path: Path) -> None:
    _, recipe, overrides = WRITTEN_BY_MAIN[name]
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(FIXTURES / name, folder / "config.json")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')  # the folder holds a run
    check_run_folder(load_config(folder / "config.json"), folder)  # `--config` of its own config.json
    check_run_folder(apply_overrides(get_recipe(recipe), overrides), folder)  # the same command again
    with pytest.raises(ValueError, match=r"holds a run with a different config \(trainer.seed: 0 -> 5\)"):
        check_run_folder(apply_overrides(get_recipe(recipe), [*overrides, "trainer.seed=5"]), folder)


@pytest.mark.parametrize("name, module, function", [("llada-d1.json", "dare.pipeline", "run_rl_recipe"),
                                                    ("llada-lora-sft.json", "dare.offline_pipeline", "run_sft_recipe")])
def test_train_config_of_an_old_config_json_reaches_the_pipeline_of_its_kind(
        name: str, module: str, function: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module(module), function,
                        lambda cfg, *a, **k: seen.append(cfg) or {"steps": 0})
    assert main(["train", "--config", str(FIXTURES / name), "--output-dir", str(tmp_path / "run")]) == 0
    assert seen == [load_config(FIXTURES / name)] and type(seen[0]) is WRITTEN_BY_MAIN[name][0]


def test_a_section_of_another_kind_in_config_json_is_refused_naming_the_kind(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "llada-d1.json").read_text())
    data["sft"] = {"steps": 3}
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"recipe 'llada-d1' with algorithm 'd1' is an RL recipe, which has the "
                                         r"sections checkpoint, data, rl, rl_optim .*not sft\."):
        load_config(tmp_path / "c.json")
