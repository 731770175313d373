"""trainer.backend="ray": a 2-rank FSDP2 actor group (gloo, CPU) runs RL steps of the tiny setup."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.dllm_train.helpers import tiny_config, tiny_workflow

pytestmark = pytest.mark.ray


def test_ray_workflow_runs_rl_steps_and_reports_the_local_metrics(ray_cluster: Any) -> None:
    from dare.quickstart import build_tiny_model
    from dare.tasks.addition import AdditionTask, build_tokenizer
    from dllm_train import PromptBatch, derive_seed
    from dllm_train.distributed import DistributedConfig, RayRLWorkflow
    from tests.dllm_train.distributed_helpers import tiny_rank_setup

    cfg = tiny_config()
    tok = build_tokenizer()
    task = AdditionTask(cfg.task, tok)
    local, _ = tiny_workflow(cfg)

    def prompts(step: int) -> PromptBatch:
        pairs = task.train_pairs(cfg.rl.prompts_per_step, derive_seed(cfg.trainer.seed, "rl-data", step))
        return PromptBatch([task.encode(task.prompt(a, b)) for a, b in pairs],
                           [task.answer(a, b) for a, b in pairs], cfg.rl.group_size)

    driver_model = build_tiny_model(cfg, tok)
    before = {k: v.clone() for k, v in driver_model.state_dict().items()}
    wf = RayRLWorkflow(setup_fn=tiny_rank_setup, prompts=prompts, objective=local.objective,
                       trainer=cfg.trainer, rl=cfg.rl, dist=DistributedConfig(num_workers=2),
                       driver_model=driver_model)
    try:
        expected = set(local.step(0))
        for step in range(2):
            metrics = wf.step(step)
            assert set(metrics) == expected
            assert all(isinstance(v, float) for v in metrics.values())
        assert metrics["skipped"] == 0.0
        for report in wf.group.call("handoff_report"):  # d1 on llada: the rollout replica equals the actor
            assert report["max_abs_gap"] == 0.0 and len(report["keys"]) == report["num_weights"], report
        wf.pull_weights(driver_model)
        assert any(not torch.equal(before[k], v) for k, v in driver_model.state_dict().items())
        state = wf.state()  # full optimizer state gathered on rank 0, round-trips through load_state
        assert state["updates"] == 2 and state["optimizer"]["state"]
        wf.load_state(state)
    finally:
        wf.shutdown()



# --- algorithms beyond the quick start's, a block-diffusion family, LoRA and sequence parallelism ---

def _prompts(step: int) -> Any:
    from dllm_train import PromptBatch, derive_seed
    from tests.dllm_train.algo_helpers import TASK
    from tests.dllm_train.distributed_helpers import TINY_RL

    pairs = TASK.train_pairs(TINY_RL.prompts_per_step, derive_seed(0, "rl-data", step))
    return PromptBatch([TASK.encode(TASK.prompt(a, b)) for a, b in pairs],
                       [TASK.answer(a, b) for a, b in pairs], TINY_RL.group_size)


def _ray_run(family: str, name: str, fields: dict[str, Any], *, steps: int = 2, lora_rank: int = 0,
             sequence_parallel: int = 1) -> tuple[list[dict[str, float]], list[dict[str, Any]], Any]:
    """`steps` RL steps of `name` on 2 Ray ranks; (metrics per step, hand-off reports per rank, full weights)."""
    import functools

    from dllm_train import TrainerConfig
    from dllm_train.distributed import DistributedConfig, RayRLWorkflow
    from tests.dllm_train.distributed_helpers import TINY_RL, algorithm_objective, algorithm_rank_setup

    trainer = TrainerConfig(max_steps=steps, seed=0, backend="ray", num_workers=2,
                            sequence_parallel=sequence_parallel)
    wf = RayRLWorkflow(setup_fn=functools.partial(algorithm_rank_setup, family, name, fields, lora_rank),
                       prompts=_prompts, objective=algorithm_objective(name, fields), trainer=trainer, rl=TINY_RL,
                       dist=DistributedConfig(num_workers=2, sequence_parallel=sequence_parallel))
    try:
        metrics = [wf.step(step) for step in range(steps)]
        reports = wf.group.call("handoff_report")
        weights = wf.group.call("full_weights")[0]
    finally:
        wf.shutdown()
    return metrics, reports, weights


def _check_run(family: str, name: str, metrics: list[dict[str, float]], reports: list[dict[str, Any]],
               weights: dict[str, torch.Tensor]) -> None:
    from tests.dllm_train.algo_helpers import tiny_model

    for m in metrics:
        assert all(math.isfinite(v) for v in m.values()), m
        assert m["skipped"] == 0.0, m
    init = tiny_model(family).state_dict()
    assert any(not torch.equal(init[k], v) for k, v in weights.items()), f"{name} on {family} did not train"
    for r in reports:  # every rank's rollout replica holds exactly the actor's weights after the hand-off
        assert r["max_abs_gap"] == 0.0, r
        assert len(r["keys"]) == r["num_weights"], r  # full weights (no adapters here)


# Every (algorithm, family) pair the app defines among llada and sdar, with registry fields that
# keep the tiny run small. d1 on llada runs in test_ray_workflow_runs_rl_steps_and_reports_the_local_metrics.
# Measured on a shared 2-core machine: 14-22 s each (up to 33 s while a benchmark ran beside);
# starting the two actors (a process each: torch, the packages, the model) takes most of it, not
# the steps.
RAY_CASES = [
    # sequence ELBOs on stratified count masks, per-sample backward
    pytest.param("llada", "bgpo", {"mc_num": 2}, id="bgpo-llada"),
    # replays the recorded trajectory, one backward per state (states padded to the ranks' max)
    pytest.param("llada", "cj-grpo", {}, id="cj-grpo-llada"),
    # an FSDP2 reference worker (k2 KL) and two off-policy updates per batch
    pytest.param("llada", "espo", {"mc_num": 2, "num_iterations": 2}, id="espo-llada"),
    # the rollout scores its canvases with an unsharded frozen copy of the initial policy
    pytest.param("llada", "dmpo", {"num_replicates": 2}, id="dmpo-llada", marks=pytest.mark.slow),
    # block diffusion: BD3LM rows under FSDP2
    pytest.param("sdar", "bgpo", {"mc_num": 2}, id="bgpo-sdar", marks=pytest.mark.slow),
    # complementary masks, one forward
    pytest.param("llada", "coupled-grpo", {}, id="coupled-grpo-llada", marks=pytest.mark.slow),
    # exact left-to-right log-probs, chunks of positions (padded to the ranks' max), each its own backward
    pytest.param("llada", "justgrpo", {"chunk_size": 2}, id="justgrpo-llada", marks=pytest.mark.slow),
    # ELBO / EUBO sandwich, REINFORCE without old values
    pytest.param("llada", "spg", {}, id="spg-llada", marks=pytest.mark.slow),
    # rewarded intermediate predictions: the reward worker scores every step on each rank
    pytest.param("llada", "mdpo", {"top_k_steps": 2}, id="mdpo-llada", marks=pytest.mark.slow),
    # tree rollouts (one tree per rank: branching ** depth = the group size) and an FSDP2 reference
    pytest.param("llada", "d-treerpo", {"branching": 2, "depth": 2, "num_iterations": 2}, id="d-treerpo-llada",
                 marks=pytest.mark.slow),
    # composite block ELBO with proxy backward
    pytest.param("sdar", "ebpo", {"mc_num": 2}, id="ebpo-sdar", marks=pytest.mark.slow),
    # block-local replay states; a state whose rows hold no noised block still runs one forward
    pytest.param("sdar", "cj-grpo", {}, id="cj-grpo-sdar", marks=pytest.mark.slow),
]
COVERED_ELSEWHERE = {("d1", "llada")}


def test_ray_cases_cover_every_algorithm_family_pair() -> None:
    from dare.algorithms import ALGORITHMS

    defined = {(name, fam) for name, entry in ALGORITHMS.items() for fam in entry.families if fam in ("llada", "sdar")}
    listed = [(p.values[1], p.values[0]) for p in RAY_CASES]
    assert len(listed) == len(set(listed))
    assert set(listed) | COVERED_ELSEWHERE == defined


# The other two families, one case each: Dream (masked diffusion, logits shifted by one) and
# LLaDA2 (block diffusion, MoE experts routed differently on each rank).
OTHER_FAMILY_CASES = [
    pytest.param("dream", "coupled-grpo", {}, id="coupled-grpo-dream", marks=pytest.mark.slow),
    pytest.param("llada2", "cj-grpo", {}, id="cj-grpo-llada2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("family", "name", "fields"), RAY_CASES + OTHER_FAMILY_CASES)
def test_ray_runs_algorithm(ray_cluster: Any, family: str, name: str, fields: dict[str, Any]) -> None:
    metrics, reports, weights = _ray_run(family, name, fields)
    _check_run(family, name, metrics, reports, weights)


@pytest.mark.slow
def test_ray_lora_hands_off_adapter_weights_only(ray_cluster: Any) -> None:
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup

    metrics, reports, weights = _ray_run("llada", "d1", {}, lora_rank=4)
    assert all(m["skipped"] == 0.0 for m in metrics)
    init = algorithm_rank_setup("llada", "d1", {}, 4).model.state_dict()
    moved = {k for k, v in weights.items() if not torch.equal(init[k], v)}
    assert moved and all("lora_" in k for k in moved), sorted(moved)[:5]  # adapters trained, base frozen
    for r in reports:
        assert r["keys"] and all("lora_" in k for k in r["keys"]), r["keys"][:5]  # adapters only
        assert len(r["keys"]) < r["num_weights"], r
        assert r["max_abs_gap"] == 0.0, r  # ... and the rollout replica equals the actor


@pytest.mark.slow
def test_ray_sequence_parallel_run_matches_the_local_workflow(ray_cluster: Any) -> None:
    # sequence_parallel = 2 on 2 ranks: one data-parallel group that holds the whole batch, so the
    # rollout, the plan and the update are the local workflow's, with every sequence split in two
    from tests.dllm_train.algo_helpers import tiny_model, workflow

    metrics, reports, weights = _ray_run("llada", "d1", {}, steps=2, sequence_parallel=2)
    local_model = tiny_model("llada")
    local = workflow(local_model, "d1")
    expected = [local.step(step) for step in range(2)]
    for got, want in zip(metrics, expected):
        assert got["reward_mean"] == want["reward_mean"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    ref = local_model.state_dict()
    assert max(float((weights[k] - ref[k]).abs().max()) for k in ref) < 1e-4
    assert all(r["max_abs_gap"] == 0.0 for r in reports)
