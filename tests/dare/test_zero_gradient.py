"""Settings under which the RL policy gradient is identically zero are refused at config
validation, naming the field (issue #25 item 4): RL at `rollout.temperature=0` for algorithms
that learn from differences within a group (each declares it: `needs_distinct_samples`).

The declarations are checked against real steps: at temperature 0 every declaring algorithm
trains with grad norm exactly 0 on a tiny model, and the others (DMPO without a cancelling
baseline) and randomised decoding keep a gradient."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from dare.algorithms import ALGORITHMS
from dare.config import apply_overrides
from dare.recipes import RECIPES, get_recipe, quickstart
from dllm_algorithms import DMPO
from dllm_rollout import decode
from tests.tiny_rl import SAMPLING, addition_prompts, fast, local_rl, text_reward, tiny_model

RL_RECIPES = [name for name in RECIPES if name != "quickstart" and get_recipe(name).kind == "rl"]


@pytest.mark.parametrize("recipe", ["quickstart", *RL_RECIPES])
def test_temperature_zero_is_refused_naming_the_field(recipe: str) -> None:
    with pytest.raises(ValueError, match=r"^rollout\.temperature=0\.0 .* policy gradient of exactly 0.*"
                                         r"Set rollout\.temperature > 0"):
        apply_overrides(get_recipe(recipe), ["rollout.temperature=0"])


def test_the_cli_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from dare.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "rollout.temperature=0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("dare: error: rollout.temperature=0.0 ") and err.count("\n") == 1


@pytest.mark.parametrize("overrides", [
    ["rollout.temperature=0", "rollout.remasking=random"],  # random commit order: rows differ
    ["rollout.temperature=0.1"],
])
def test_randomised_decoding_is_accepted(overrides: list[str]) -> None:
    assert apply_overrides(quickstart(), overrides).rollout.temperature == float(overrides[0].split("=")[1])


@pytest.mark.parametrize("overrides", [["algorithm.baseline=none"], ["algorithm.alpha=-1"]])
def test_dmpo_without_a_cancelling_baseline_is_accepted(overrides: list[str]) -> None:
    cfg = apply_overrides(get_recipe("llada-dmpo"), ["rollout.temperature=0", *overrides])
    assert not cfg.algorithm.needs_distinct_samples


CASES: dict[str, Any] = {**ALGORITHMS, "dmpo-no-baseline": DMPO(baseline="none"),
                         "dmpo-raw-individual": DMPO(alpha=-1), "dmpo-raw-group": DMPO(alpha=-1, baseline="group")}


@pytest.mark.parametrize("name", list(CASES))
def test_declarations_match_a_real_step_at_temperature_zero(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the trainer refuses these settings (check_settings); run the refused step anyway to show that
    # each algorithm's declaration is true
    import dllm_train.step as step
    import dllm_train.local as local

    real = step.check_settings
    relaxed = dataclasses.replace

    def check(algorithm: Any, sampling: Any, *, consistency_every: int) -> None:
        real(algorithm, relaxed(sampling, temperature=1.0), consistency_every=consistency_every)

    monkeypatch.setattr(step, "check_settings", check)
    monkeypatch.setattr(local, "check_settings", check)
    torch.manual_seed(0)
    algorithm = CASES[name]
    family = "llada" if "llada" in algorithm.families else "sdar"
    greedy = dataclasses.replace(SAMPLING, temperature=0.0)
    metrics = local_rl(tiny_model(family), fast(algorithm), sampling=greedy, reward=text_reward).step(0)
    assert float(metrics["reward_std"]) > 0  # prompts differ; only the samples of each group agree
    assert (float(metrics["grad_norm"]) == 0.0) == algorithm.needs_distinct_samples


def test_randomised_commits_at_temperature_zero_keep_a_gradient() -> None:
    sampling = dataclasses.replace(SAMPLING, temperature=0.0, remasking="random")
    assert not sampling.deterministic
    metrics = local_rl(tiny_model("llada"), ALGORITHMS["d1"], sampling=sampling, reward=text_reward).step(0)
    assert float(metrics["grad_norm"]) > 0


@pytest.mark.parametrize(("family", "changes"), [
    ("llada", {}), ("llada", {"remasking": "random"}), ("dream", {"remasking": "origin"}),
    ("dream", {"remasking": "entropy"}), ("dream", {"remasking": "entropy", "alg_temp": 0.5}),
    ("dream", {"remasking": "origin", "threshold": 0.5}), ("sdar", {}), ("llada", {"temperature": 1.0}),
])
def test_deterministic_means_every_row_of_a_prompt_decodes_the_same(family: str, changes: dict[str, Any]) -> None:
    sampling = dataclasses.replace(SAMPLING, **{"temperature": 0.0, "block_diffusion": family == "sdar", **changes})
    model = tiny_model(family)
    prompts = addition_prompts(4, 1)(0).prompts  # 4 prompts, each decoded by 8 rows (seeds differ)
    ids = torch.tensor([p for p in prompts for _ in range(8)])
    out = decode(model, ids, torch.ones_like(ids, dtype=torch.bool), torch.arange(len(ids)), sampling)
    groups = [{tuple(r) for r in out.response_ids[i:i + 8].tolist()} for i in range(0, len(ids), 8)]
    assert all(len(g) == 1 for g in groups) == sampling.deterministic
