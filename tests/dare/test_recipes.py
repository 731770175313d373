"""Every recipe builds and validates; algorithm overrides are checked."""

from __future__ import annotations

import pytest

from dare.recipes import RECIPES, get_recipe
from dare.run_config_ext import RecipeRunConfig, resolve_algorithm


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_builds_and_resolves(name: str) -> None:
    cfg = get_recipe(name)
    assert cfg.recipe == name
    if isinstance(cfg, RecipeRunConfig):
        resolve_algorithm(cfg)


def test_llada2_sft_uses_reference_t_range() -> None:
    cfg = get_recipe("llada2-sft")
    assert isinstance(cfg, RecipeRunConfig)
    assert resolve_algorithm(cfg).t_range == (0.3, 0.8)


def test_undefined_pair_and_bad_args_raise() -> None:
    from dare.run_config_ext import CheckpointModelConfig

    with pytest.raises(ValueError, match="defined for"):
        RecipeRunConfig(algorithm="ebpo", checkpoint=CheckpointModelConfig(family="llada"))
    with pytest.raises(ValueError, match="algorithm_args"):
        RecipeRunConfig(algorithm="bgpo", algorithm_args=("nope=1",))
