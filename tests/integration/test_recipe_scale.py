"""benchmarks/recipe_scale.py: the flags the issue-36 rows rely on (`--update-set`, `--profile`).

The H200 rows run the product's step through this script, so its own rules are checked here on
the CPU: an `--update-set` that would change the update's required work is refused, the kernel
groups of `--profile` read CUDA kernel names as the tables report them, and (slow) a tiny end-to-end
run with both flags gives its rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import recipe_scale as rs  # noqa: E402
from dare.recipes import get_recipe, resolve  # noqa: E402

SHAPE = rs.Shape(params=7_000_000_000, weight_bytes=14_000_000_000, kv_bytes_per_pos=147_456, q_width_layers=4096 * 32)
PROMPTS = [[1] * 70, [1] * 80]


def _check(recipe: str, update_set: list[str]) -> None:
    cfg = resolve(get_recipe(recipe), [])
    step_cfg = resolve(get_recipe(recipe), update_set)
    assert cfg.rollout is not None and step_cfg.rollout is not None
    rs.check_update_work(cfg, step_cfg, cfg.rollout, step_cfg.rollout, PROMPTS, SHAPE,
                         argparse.Namespace(update_set=update_set))


@pytest.mark.parametrize(("recipe", "update_set"), [("llada-d1", ["rollout.steps=16"]),
                                                   ("sdar-bgpo", ["rollout.steps=1"])])
def test_update_set_that_keeps_the_update_work_is_accepted(recipe: str, update_set: list[str]) -> None:
    _check(recipe, update_set)  # d1: one pass per sequence; BGPO: mc_num masks, whatever the decoding steps


@pytest.mark.parametrize(("recipe", "update_set"), [("llada-cj-grpo", ["rollout.steps=16"]),  # one row per step
                                                   ("llada-d1", ["rollout.max_new_tokens=256"]),
                                                   ("sdar-bgpo", ["algorithm.mc_num=4"])])
def test_update_set_that_changes_the_update_work_is_refused(recipe: str, update_set: list[str]) -> None:
    with pytest.raises(SystemExit, match="changes the update's required work"):
        _check(recipe, update_set)


@pytest.mark.parametrize(("name", "group"), [
    ("_bwd_kernel", "attention backward"),
    ("_fwd_kernel", "attention forward"),
    ("triton_tem_fused_flex_attention_backward_0", "attention backward"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<1", "attention backward"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "GEMM"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat1", "other (norms, RoPE, SwiGLU, head, copies)"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<adam>", "optimizer"),
])
def test_profile_groups_kernels_by_name(name: str, group: str) -> None:
    assert rs.kernel_group(name) == group


@pytest.mark.slow
def test_tiny_run_with_update_set_and_profile(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    assert rs.main(["--tiny", "--recipes", "llada-d1", "--update-rows", "16", "--update-set", "rollout.steps=2",
                    "--profile", "3", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    rollout, update = rows[0], rows[-1]
    assert rollout["phase"].startswith("rollout") and "update_set" not in rollout
    assert rollout["forwards_counted"] == rollout["forwards_formula"] == 4  # the recipe's tiny steps, not the update's 2
    assert update["phase"] == "update" and update["update_set"] == ["rollout.steps=2"]
    assert update["profile"]["device_s"] > 0 and len(update["profile"]["top"]) == 3
