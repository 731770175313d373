"""Every recipe builds and validates; algorithm overrides are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dare.config import KINDS, SECTIONS, CheckpointModelConfig, RLRecipeConfig, apply_overrides, registry_entry
from dare.recipes import RECIPE_DOCS, RECIPES, get_recipe
from dllm_models import FAMILY_NAMES


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_builds_with_its_kind_sections_and_algorithm_entry(name: str) -> None:
    cfg = get_recipe(name)
    assert cfg.recipe == name
    present = {n for names in SECTIONS.values() for n in names if getattr(cfg, n, None) is not None}
    assert present == set(SECTIONS[cfg.kind])  # no quick-start task/model in a recipe, and so on
    assert type(cfg) is KINDS[cfg.kind]  # each kind of run is its own class
    assert type(cfg.algorithm) is type(registry_entry(cfg.algorithm_name))


def test_llada2_sft_uses_reference_t_range() -> None:
    cfg = get_recipe("llada2-sft")
    assert cfg.algorithm.t_range == (0.3, 0.8)
    # the SFT loss settings have one home, sft.*, which the algorithm entry follows
    cfg = apply_overrides(cfg, ["sft.normalizer=answer_len", "sft.eps=0.01"])
    assert (cfg.algorithm.normalizer, cfg.algorithm.eps) == ("answer_len", 0.01)


def test_undefined_pair_and_bad_args_raise() -> None:
    with pytest.raises(ValueError, match="defined for"):
        RLRecipeConfig(recipe="x", algorithm_name="ebpo", checkpoint=CheckpointModelConfig(family="llada"))
    with pytest.raises(ValueError, match=r"unknown config key 'algorithm.nope': algorithm 'bgpo' has \['clip_high'"):
        apply_overrides(get_recipe("llada-bgpo"), ["algorithm.nope=1"])


def test_every_recipe_has_a_one_line_description_naming_family_and_paper() -> None:
    assert set(RECIPE_DOCS) == set(RECIPES)
    for name, doc in RECIPE_DOCS.items():
        assert "\n" not in doc and "partial(" not in doc and "spec §" not in doc, name
        if name != "quickstart":
            # the paper's arXiv id, or (BridgeRatio-GRPO, which has no paper) the original's pull request
            assert ("arXiv" in doc or "DARE PR #" in doc) and "diffusion)" in doc, (name, doc)
    assert RECIPE_DOCS["sdar_moe-bgpo"] == "SDAR-MoE (block diffusion), RL: BGPO (Lin et al., arXiv 2510.11683)"


def test_released_size_rl_recipes_offload_the_optimizer_state_and_the_quickstart_does_not() -> None:
    from dllm_train import TrainerConfig

    assert TrainerConfig().optimizer_offload is False
    assert get_recipe("quickstart").trainer.optimizer_offload is False
    rl = [n for n in RECIPES if get_recipe(n).kind == "rl" and n.split("-")[0] in ("sdar", "llada", "dream")]
    assert {"sdar-bgpo", "llada-d1", "dream-d1"} <= set(rl)
    assert all(get_recipe(n).trainer.optimizer_offload for n in rl)


def test_every_family_of_the_registry_has_recipes() -> None:
    for family in FAMILY_NAMES:
        assert f"{family}-sft" in RECIPES and f"{family}-lora-sft" in RECIPES, family
        assert any(n.startswith(f"{family}-") and n.removeprefix(f"{family}-") not in ("sft", "lora-sft")
                   for n in RECIPES), family
    assert {"sdar_moe-bgpo", "sdar_moe-ebpo", "sdar_moe-cj-grpo"} <= set(RECIPES)


@pytest.fixture(scope="module")
def tiny_sdar_moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny SDAR-MoE checkpoint with the addition task's tokenizer, and RL / SFT parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from dare.tasks.addition import build_tokenizer
    from dllm_models import build_model, save_model
    from tests.dare.helpers import addition_rl_parquet
    from tests.dllm_models.tiny_configs import tiny_sdar_moe_config

    tok = build_tokenizer()
    root = tmp_path_factory.mktemp("sdar-moe")
    model = build_model(tiny_sdar_moe_config(vocab_size=len(tok), mask_token_id=tok.mask_token_id,
                                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)  # type: ignore[operator]
    save_model(model, root / "ckpt", tokenizer=tok)
    pairs = [(12, 34), (5, 71), (40, 40), (9, 9)]
    addition_rl_parquet(root / "rl.parquet", pairs)
    pq.write_table(pa.table({"prompt": [f"{a:02d}+{b:02d}=" for a, b in pairs],
                             "response": [f"{a + b:03d}" for a, b in pairs]}), root / "sft.parquet")
    return {"ckpt": root / "ckpt", "rl": root / "rl.parquet", "sft": root / "sft.parquet"}


@pytest.mark.parametrize(("recipe", "extra"), [
    ("sdar_moe-bgpo", ("rollout.max_new_tokens=8", "rollout.steps=4", "rollout.block_length=4",
                       "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=1")),
    ("sdar_moe-lora-sft", ("sft.steps=2", "sft.batch_size=2", "checkpoint.lora_rank=2")),
])
def test_sdar_moe_recipes_run_at_toy_size(recipe: str, extra: tuple[str, ...], tiny_sdar_moe: dict[str, Path],
                                          tmp_path: Path) -> None:
    from dare.cli import main

    data = tiny_sdar_moe["rl" if recipe.endswith("bgpo") else "sft"]
    out = tmp_path / "run"
    assert main(["train", recipe, f"checkpoint.checkpoint={tiny_sdar_moe['ckpt']}", "checkpoint.dtype=float32",
                 f"data.train_files={data}", "data.max_prompt_length=64", "data.max_response_length=16", *extra,
                 "--output-dir", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == recipe and summary["steps"] >= 1
    assert json.loads((out / "config.json").read_text())["checkpoint"]["family"] == "sdar_moe"


def test_recipes_expose_the_validation_rows() -> None:
    cfg = get_recipe("llada-d1")
    assert cfg.data is not None and cfg.data.eval_max_rows == 64
    assert apply_overrides(cfg, ["data.eval_max_rows=0"]).data.eval_max_rows == 0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="data.eval_max_rows must be >= 0"):
        apply_overrides(cfg, ["data.eval_max_rows=-1"])
