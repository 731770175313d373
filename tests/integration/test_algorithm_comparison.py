"""The Sudoku / Countdown algorithm comparison end to end on the shipped subsets (`--tiny`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from comparison_tasks import read_rows, solve_countdown, target_text, verify  # noqa: E402


def test_countdown_solver_expressions_pass_the_real_verifier() -> None:
    rows = read_rows(ROOT / "benchmarks" / "data" / "countdown-test-tiny.parquet")
    for row in rows:
        expr = target_text("countdown", row)
        assert expr is not None and verify(expr, row.key()) == (1.0, 1.0), (row, expr)
    assert solve_countdown([2, 3, 4], 5) == "2*4-3"  # the prompt's own example, shortest form
    assert solve_countdown([1, 1, 1], 100) is None


def test_sudoku_targets_pass_and_a_wrong_grid_fails() -> None:
    row = read_rows(ROOT / "benchmarks" / "data" / "sudoku-test-tiny.parquet")[0]
    assert verify(row.ground_truth, row.key()) == (1.0, 1.0)
    assert verify("1" * 16, row.key())[1] == 0.0


@pytest.mark.slow
def test_tiny_comparison_runs_every_task_and_family(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "algorithm_comparison.py"), "--tiny",
                    "--out", str(tmp_path)], check=True, cwd=ROOT, timeout=600)
    for task in ("sudoku", "countdown"):
        for family in ("llada", "sdar", "dream"):
            result = json.loads((tmp_path / f"{task}-{family}.json").read_text())
            assert set(result["runs"]) == {"cj-grpo", "control (cj-grpo, coin-flip reward)"}
            for seeds in result["runs"].values():
                assert len(seeds) == 2 and all(len(s["rewards"]) == 2 and 0 <= s["after"] <= 1 for s in seeds)
                assert all(s["sampling"]["remasking"] == "low_confidence" for s in seeds)  # --sampler fixed
            assert (tmp_path / f"{task}-{family}.png").stat().st_size > 0


@pytest.mark.slow
def test_tiny_comparison_with_the_dare_sampler_decodes_each_recipes_rule(tmp_path: Path) -> None:
    """`--sampler dare` end to end on every family: the runs are labelled and record the rule they decoded with."""
    rules = {"llada": ("low_confidence", None, None), "sdar": ("low_confidence_dynamic", 0.9, None),
             "dream": ("entropy", None, 0.95)}
    for family, algorithm in (("sdar", "bgpo"), ("dream", "d1"), ("llada", "d1")):
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "algorithm_comparison.py"), "--tiny",
                        "--task", "sudoku", "--family", family, "--algorithms", algorithm, "--control", "none",
                        "--sampler", "dare", "--out", str(tmp_path)], check=True, cwd=ROOT, timeout=600)
        result = json.loads((tmp_path / f"sudoku-{family}.json").read_text())
        assert result["settings"]["sampler"] == "dare"
        (seeds,) = result["runs"].values()
        assert list(result["runs"]) == [f"{algorithm} [dare sampler]"] and len(seeds) == 2
        for s in seeds:
            rule = (s["sampling"]["remasking"], s["sampling"]["threshold"], s["sampling"]["top_p"])
            assert rule == rules[family] and s["sampling"]["temperature"] == 1.0 and 0 <= s["after"] <= 1


def test_the_dare_sampler_takes_the_recipes_rule_on_the_benchmarks_grid() -> None:
    from algorithm_comparison import RULE_FIELDS, rollout_sampling, sampling

    from dare.recipes import get_recipe

    # DARE's values (issue 35 items 5 and 6): SDAR BGPO's threshold rule at 0.9, at least one token per step
    # (steps = block length); Dream's entropy rule with top-p 0.95 and the block-start commit
    sdar = rollout_sampling("sdar", "bgpo", "dare")
    assert (sdar.remasking, sdar.threshold, sdar.block_diffusion) == ("low_confidence_dynamic", 0.9, True)
    assert (sdar.steps, sdar.block_length, sdar.temperature) == (4, 4, 1.0)  # the benchmark's grid, T = 1
    dream = rollout_sampling("dream", "d1", "dare")
    assert (dream.remasking, dream.top_p, dream.commit_block_start, dream.threshold) == ("entropy", 0.95, True, None)
    assert (dream.steps, dream.block_length, dream.block_diffusion, dream.temperature) == (16, 16, False, 1.0)
    for family, algorithm in (("sdar", "bgpo"), ("dream", "d1"), ("llada", "d1"), ("llada", "mdpo")):
        dare = rollout_sampling(family, algorithm, "dare")
        recipe = get_recipe(f"{family}-{algorithm}").rollout  # type: ignore[attr-defined]
        assert all(getattr(dare, k) == getattr(recipe, k) for k in RULE_FIELDS), (family, algorithm)
        # the fixed sampler is the rule the rows before issue 35 were measured with
        assert rollout_sampling(family, algorithm, "fixed") == sampling(family, temperature=1.0)
    for algorithm in ("d1", "mdpo", "d-treerpo", "cj-grpo"):  # LLaDA's recipes decode with the fixed rule already
        assert rollout_sampling("llada", algorithm, "dare") == rollout_sampling("llada", algorithm, "fixed")
    assert rollout_sampling("llada", "justgrpo", "dare").block_length == 1  # JustGRPO still decodes left to right
    with pytest.raises(ValueError, match="no recipe 'sdar-d1'"):
        rollout_sampling("sdar", "d1", "dare")
    with pytest.raises(ValueError, match="--sampler 'greedy' unknown"):
        rollout_sampling("sdar", "bgpo", "greedy")


def test_dream_family_is_built_at_the_quick_start_size_and_decodes_the_task() -> None:
    import torch
    from algorithm_comparison import build, rollout_sampling
    from comparison_tasks import build_tokenizer

    from dllm_rollout import decode, left_pad

    tok = build_tokenizer()
    model = build("dream", tok)
    assert model.traits.family == "dream" and model.traits.mask_token_id == tok.mask_token_id
    llada = build("llada", tok)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.7 < n_params / sum(p.numel() for p in llada.parameters()) < 1.0  # 2 KV heads: a bit smaller
    ids, mask = left_pad([[3, 4, 5, 6] * 4] * 2, model.traits.pad_token_id)
    seeds = torch.arange(2)
    fixed = decode(model, ids, mask, seeds, rollout_sampling("dream", "d1", "fixed")).response_ids
    dare = decode(model, ids, mask, seeds, rollout_sampling("dream", "d1", "dare")).response_ids
    assert fixed.shape == dare.shape == (2, 16)
    assert not torch.equal(fixed, dare)  # the entropy rule with top-p decodes other responses from the same seeds


def test_variants_set_algorithm_optimizer_and_task_fields_through_their_classes() -> None:
    from algorithm_comparison import configure, parse_spec, split_specs

    assert split_specs("d1[prompt_mask_prob=0,optim.lr=1e-4],spg") == ["d1[prompt_mask_prob=0,optim.lr=1e-4]", "spg"]
    assert parse_spec("dmpo[baseline=group,num_iterations=1]") == ("dmpo", {"baseline": "group", "num_iterations": 1})
    alg, optim, fields = configure("d1[prompt_mask_prob=0,optim.lr=1e-4]", "llada", 2e-4)
    assert (alg.prompt_mask_prob, optim.lr, optim.grad_clip) == (0, 1e-4, 1.0)
    assert fields == {"prompt_mask_prob": 0, "optim.lr": 1e-4}
    alg, optim, fields = configure("espo[task=countdown]", "llada", 2e-4)  # DARE's countdown ESPO: beta 0.003, no clip
    assert (alg.kl_coef, alg.clip_low, alg.clip_high, alg.mc_num, optim.lr) == (0.003, 0.0, 0.0, 2, 2e-4)
    with pytest.raises(ValueError, match=r"\['promt_mask_prob'\] are not fields of algorithm d1"):
        configure("d1[promt_mask_prob=0]", "llada", 2e-4)
    with pytest.raises(ValueError, match="algorithm.mc_num must be even"):  # the class's own validation
        configure("dmpo[mc_num=3]", "llada", 2e-4)
