"""`dare show <RL recipe>` states the rollout record fields its algorithm reads (issue 40)."""

from __future__ import annotations

import pytest

from dare.recipes import get_recipe
from dare.show import describe_config


@pytest.mark.parametrize(("recipe", "fields"), [("llada-mdpo", "step_canvas, step_confidence, step_x0"),
                                                 ("sdar-tracerl", "unmask_step"), ("llada-cj-grpo", "unmask_step"),
                                                 ("llada-dmpo", "ref_step_logp, step_logp")])
def test_show_lists_the_record_fields_the_algorithm_reads(recipe: str, fields: str) -> None:
    cfg = get_recipe(recipe)
    assert f"rollout record (version 1): {cfg.algorithm_name} reads {fields};" in describe_config(cfg)


def test_show_says_when_an_algorithm_reads_only_the_tokens() -> None:
    assert "d1 reads none beyond the tokens" in describe_config(get_recipe("llada-d1"))
    assert "rollout record (version" not in describe_config(get_recipe("llada-sft"))
