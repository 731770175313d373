"""trainer.backend="ray": a 2-rank FSDP2 actor group (gloo, CPU) runs RL steps of the tiny setup,
through the same `dllm_train.rl_step` as one process."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_algorithms import (BGPO, CJGRPO, D1, DMPO, EBPO, ESPO, GDPO, MDPO, SPG, BridgeRatioGRPO, CoupledGRPO, DTreeRPO,
                             JustGRPO, TraceRL)
from dllm_train import RLAlgorithm
from tests.tiny_rl import addition_prompts, local_rl, reproducible, tiny_model

pytestmark = pytest.mark.ray


def test_ray_workflow_runs_rl_steps_and_reports_the_local_metrics(ray_cluster: Any, tmp_path: Path) -> None:
    from dllm_train import TrainerConfig
    from dllm_train.distributed import RankWorker, RayRLWorkflow
    from tests.dllm_train.distributed_helpers import TINY_RL, tiny_rank_setup

    local = local_rl(tiny_model("llada"), D1())
    driver_model = tiny_model("llada")
    before = {k: v.clone() for k, v in driver_model.state_dict().items()}
    trainer = TrainerConfig(max_steps=2, seed=0, backend="ray", num_workers=2)
    wf = RayRLWorkflow(setup_fn=tiny_rank_setup, prompts=addition_prompts(TINY_RL.prompts_per_step, TINY_RL.group_size),
                       algorithm=D1(), trainer=trainer, rl=TINY_RL, driver_model=driver_model)
    try:
        expected = set(local.step(0))
        for step in range(2):
            metrics = wf.step(step)
            assert set(metrics) == expected
            assert all(isinstance(v, float) for v in metrics.values())
        assert metrics["skipped"] == 0.0
        for report in wf.group.call(RankWorker.handoff_report):  # d1 on llada: the rollout replica equals the actor
            assert report["max_abs_gap"] == 0.0 and len(report["keys"]) == report["num_weights"], report
        wf.pull_weights(driver_model)
        assert any(not torch.equal(before[k], v) for k, v in driver_model.state_dict().items())
        # checkpoints: the counters through the driver, parameters and optimizer state as the ranks' shards
        state = wf.state()
        assert state == {"updates": 2, "skipped": 0}
        wf.save_shards(tmp_path / "shards")
        assert (tmp_path / "shards" / ".metadata").is_file()
        saved = wf.group.call(RankWorker.full_weights)[0]
        first = wf.step(2)
        after = wf.group.call(RankWorker.full_weights)[0]
        assert any(not torch.equal(saved[k], v) for k, v in after.items())
        wf.load_state(state)
        wf.load_shards(tmp_path / "shards")  # back to the state after step 2, on every rank
        back = wf.group.call(RankWorker.full_weights)[0]
        assert all(torch.equal(saved[k], back[k]) for k in saved)
        for report in wf.group.call(RankWorker.handoff_report):  # the rollout replicas took the loaded weights
            assert report["max_abs_gap"] == 0.0, report
        # the optimizer state came back too: step 3 reruns exactly (its moments decide the update)
        assert reproducible(wf.step(2)) == reproducible(first)
        again = wf.group.call(RankWorker.full_weights)[0]
        assert all(torch.equal(after[k], again[k]) for k in after)
    finally:
        wf.shutdown()



# --- algorithms beyond the quick start's, a block-diffusion family, LoRA and sequence parallelism ---

def _ray_run(family: str, algorithm: RLAlgorithm[Any], *, steps: int = 2, lora_rank: int = 0,
             sequence_parallel: int = 1, **trainer_fields: Any) -> tuple[list[dict[str, float]], list[dict[str, Any]], Any]:
    """`steps` RL steps of `algorithm` on 2 Ray ranks; (metrics per step, hand-off reports per rank, full weights)."""
    import functools

    from dllm_train import TrainerConfig
    from dllm_train.distributed import RankWorker, RayRLWorkflow
    from tests.dllm_train.distributed_helpers import TINY_RL, algorithm_rank_setup

    trainer = TrainerConfig(max_steps=steps, seed=0, backend="ray", num_workers=2,
                            sequence_parallel=sequence_parallel, **trainer_fields)
    wf = RayRLWorkflow(setup_fn=functools.partial(algorithm_rank_setup, family, algorithm, lora_rank, **trainer_fields),
                       prompts=addition_prompts(TINY_RL.prompts_per_step, TINY_RL.group_size), algorithm=algorithm,
                       trainer=trainer, rl=TINY_RL)
    try:
        metrics = [wf.step(step) for step in range(steps)]
        reports = wf.group.call(RankWorker.handoff_report)
        weights = wf.group.call(RankWorker.full_weights)[0]
    finally:
        wf.shutdown()
    return metrics, reports, weights


def _check_run(family: str, algorithm: RLAlgorithm[Any], metrics: list[dict[str, float]],
               reports: list[dict[str, Any]], weights: dict[str, torch.Tensor]) -> None:
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values()), m
        assert m["skipped"] == 0.0, m
    init = tiny_model(family).state_dict()
    assert any(not torch.equal(init[k], v) for k, v in weights.items()), f"{algorithm.label} on {family} did not train"
    for r in reports:  # every rank's rollout replica holds exactly the actor's weights after the hand-off
        assert r["max_abs_gap"] == 0.0, r
        assert len(r["keys"]) == r["num_weights"], r  # full weights (no adapters here)


# Every (algorithm, family) pair `dllm_algorithms` defines among llada and sdar, with fields that
# keep the tiny run small. D1 on llada runs in test_ray_workflow_runs_rl_steps_and_reports_the_local_metrics.
# Measured on a shared 2-core machine: 14-22 s each (up to 33 s while a benchmark ran beside);
# starting the two actors (a process each: torch, the packages, the model) takes most of it, not
# the steps. The fourth value: trainer fields of the run.
RAY_CASES = [
    # sequence ELBOs on stratified count masks, per-sample backward
    pytest.param("llada", BGPO(mc_num=2), {}, id="bgpo-llada"),
    # replays the recorded trajectory, one backward per state; a token budget of 2 rows per
    # forward (ranks whose pass counts differ pad to the group's max: lockstep)
    pytest.param("llada", CJGRPO(), {"max_tokens_per_pass": 24}, id="cj-grpo-llada"),
    # an FSDP2 reference worker (k2 KL), kept on the CPU between its passes (trainer.reference_offload:
    # FSDP2's CPUOffloadPolicy on the reference), and two off-policy updates per batch
    pytest.param("llada", ESPO(mc_num=2, num_iterations=2), {"reference_offload": True}, id="espo-llada"),
    # the rollout scores its canvases with an unsharded frozen copy of the initial policy
    pytest.param("llada", DMPO(mc_num=2, num_iterations=1), {}, id="dmpo-llada", marks=pytest.mark.slow),
    # block diffusion: BD3LM rows under FSDP2
    pytest.param("sdar", BGPO(mc_num=2), {}, id="bgpo-sdar", marks=pytest.mark.slow),
    # complementary masks, one forward
    pytest.param("llada", CoupledGRPO(), {}, id="coupled-grpo-llada", marks=pytest.mark.slow),
    # exact left-to-right log-probs, one row per state: a token budget of 2 rows per forward
    pytest.param("llada", JustGRPO(), {"max_tokens_per_pass": 24}, id="justgrpo-llada", marks=pytest.mark.slow),
    # ELBO / EUBO sandwich, REINFORCE without old values
    pytest.param("llada", SPG(), {}, id="spg-llada", marks=pytest.mark.slow),
    # rewarded intermediate predictions: the reward worker scores every step on each rank
    pytest.param("llada", MDPO(top_k_steps=2), {}, id="mdpo-llada", marks=pytest.mark.slow),
    # tree rollouts (one tree per rank: trees * branching ** (depth - 1) = the group size), DARE's
    # node-major mini-batches of one row per rank, and an FSDP2 reference
    pytest.param("llada", DTreeRPO(trees=2, branching=2, depth=2, num_iterations=2, row_shards=1), {}, id="d-treerpo-llada",
                 marks=pytest.mark.slow),
    # composite block ELBO, not row-local (values first, then passes backpropagating dL/dv)
    pytest.param("sdar", EBPO(mc_num=2), {}, id="ebpo-sdar", marks=pytest.mark.slow),
    # block-local replay states; a state whose rows hold no noised block still runs one forward
    pytest.param("sdar", CJGRPO(), {}, id="cj-grpo-sdar", marks=pytest.mark.slow),
    # Coupled-GRPO's paths with the bridge log ratio and the dual clip
    pytest.param("llada", BridgeRatioGRPO(), {}, id="bridgeratio-grpo-llada", marks=pytest.mark.slow),
    # quadrature ELBOs on fresh masks per iteration (issue 40)
    pytest.param("llada", GDPO(num_iterations=2), {}, id="gdpo-llada", marks=pytest.mark.slow),
    # the rollout's own trace, merged steps as replay rows (issue 40); every group kept
    pytest.param("llada", TraceRL(shrink=2, min_group_accuracy=0.0, max_group_accuracy=1.0), {}, id="tracerl-llada",
                 marks=pytest.mark.slow),
    pytest.param("sdar", TraceRL(min_group_accuracy=0.0, max_group_accuracy=1.0), {}, id="tracerl-sdar",
                 marks=pytest.mark.slow),
]
COVERED_ELSEWHERE = {(D1, "llada")}


def test_ray_cases_cover_every_algorithm_family_pair() -> None:
    import dllm_algorithms

    classes = [v for v in vars(dllm_algorithms).values() if isinstance(v, type) and issubclass(v, RLAlgorithm)]
    defined = {(cls, fam) for cls in classes for fam in cls.families if fam in ("llada", "sdar")}
    listed = [(type(p.values[1]), p.values[0]) for p in RAY_CASES]
    assert len(listed) == len(set(listed))
    assert set(listed) | COVERED_ELSEWHERE == defined


# The other two families, one case each: Dream (masked diffusion, logits shifted by one) and
# LLaDA2 (block diffusion, MoE experts routed differently on each rank).
OTHER_FAMILY_CASES = [
    pytest.param("dream", CoupledGRPO(), {}, id="coupled-grpo-dream", marks=pytest.mark.slow),
    pytest.param("llada2", CJGRPO(), {}, id="cj-grpo-llada2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("family", "algorithm", "trainer"), RAY_CASES + OTHER_FAMILY_CASES)
def test_ray_runs_algorithm(ray_cluster: Any, family: str, algorithm: RLAlgorithm[Any],
                            trainer: dict[str, Any]) -> None:
    metrics, reports, weights = _ray_run(family, algorithm, **trainer)
    _check_run(family, algorithm, metrics, reports, weights)
    if trainer.get("max_tokens_per_pass"):
        assert all(m["update_passes"] > 1 for m in metrics), metrics  # the budget did split the passes


@pytest.mark.slow
def test_ray_lora_hands_off_adapter_weights_only(ray_cluster: Any) -> None:
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup

    metrics, reports, weights = _ray_run("llada", D1(), lora_rank=4)
    assert all(m["skipped"] == 0.0 for m in metrics)
    init = algorithm_rank_setup("llada", D1(), 4).model.state_dict()
    moved = {k for k, v in weights.items() if not torch.equal(init[k], v)}
    assert moved and all("lora_" in k for k in moved), sorted(moved)[:5]  # adapters trained, base frozen
    for r in reports:
        assert r["keys"] and all("lora_" in k for k in r["keys"]), r["keys"][:5]  # adapters only
        assert len(r["keys"]) < r["num_weights"], r
        assert r["max_abs_gap"] == 0.0, r  # ... and the rollout replica equals the actor


@pytest.mark.slow
def test_ray_lora_dmpo_reads_its_rollout_reference_from_the_replicas_base_weights(ray_cluster: Any) -> None:
    # DMPO scores a reference during the rollout; under LoRA it is the replica with adapters off
    # (dllm_models.BaseWeightsView), not a third full copy of the model on every rank
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup

    metrics, reports, weights = _ray_run("llada", DMPO(mc_num=2, num_iterations=1), lora_rank=4)
    assert all(math.isfinite(v) for m in metrics for v in m.values()), metrics
    init = algorithm_rank_setup("llada", DMPO(mc_num=2, num_iterations=1), 4).model.state_dict()
    moved = {k for k, v in weights.items() if not torch.equal(init[k], v)}
    assert moved and all("lora_" in k for k in moved), sorted(moved)[:5]  # the base (the reference) stayed frozen
    assert all(r["max_abs_gap"] == 0.0 for r in reports), reports


@pytest.mark.slow
def test_ray_sequence_parallel_run_matches_the_local_workflow(ray_cluster: Any) -> None:
    # sequence_parallel = 2 on 2 ranks: one data-parallel group that holds the whole batch, so the
    # rollout, the plan and the update are the local workflow's, with every sequence split in two
    metrics, reports, weights = _ray_run("llada", D1(), steps=2, sequence_parallel=2)
    local_model = tiny_model("llada")
    local = local_rl(local_model, D1())
    expected = [local.step(step) for step in range(2)]
    for got, want in zip(metrics, expected):
        assert got["reward_mean"] == want["reward_mean"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    ref = local_model.state_dict()
    assert max(float((weights[k] - ref[k]).abs().max()) for k in ref) < 1e-4
    assert all(r["max_abs_gap"] == 0.0 for r in reports)


@pytest.mark.slow
def test_a_ray_run_stopped_by_sigterm_checkpoints_its_shards_and_resumes_exactly(ray_cluster: Any,
                                                                                 tmp_path: Path) -> None:
    # the driver catches SIGTERM, finishes the step; the ranks write their shards into the checkpoint
    import os
    import signal

    from dllm_train import PhaseSpec, Run, TrainerConfig, read_metrics
    from dllm_train.distributed import RayRLWorkflow
    from dllm_train.preemption import Interrupted
    from tests.dllm_train.distributed_helpers import TINY_RL, tiny_rank_setup

    trainer = TrainerConfig(max_steps=4, seed=0, backend="ray", num_workers=2)

    def run(out: Path, kill_after: int | None = None) -> dict[str, torch.Tensor]:
        model = tiny_model("llada")
        wf = RayRLWorkflow(setup_fn=tiny_rank_setup, prompts=addition_prompts(TINY_RL.prompts_per_step,
                           TINY_RL.group_size), algorithm=D1(), trainer=trainer, rl=TINY_RL,
                           driver_model=model)

        def step(i: int) -> dict[str, float]:
            out_ = wf.step(i)
            if i + 1 == kill_after:
                os.kill(os.getpid(), signal.SIGTERM)
            return out_
        try:
            Run(out, model, progress=False).run_phase(PhaseSpec(order=0, name="rl", steps=4, step_fn=step, owner=wf))
            return {k: v.clone() for k, v in model.state_dict().items()}
        finally:
            wf.shutdown()

    full = run(tmp_path / "full")
    with pytest.raises(Interrupted) as err:
        run(tmp_path / "cut", kill_after=2)
    assert err.value.exit_code == 143 and err.value.checkpoint is not None
    assert (err.value.checkpoint / "shards" / ".metadata").is_file()
    from dllm_train import latest_checkpoint, read_checkpoint

    ref = latest_checkpoint(tmp_path / "cut")
    assert ref is not None and ref.step == 2
    saved, _ = read_checkpoint(ref)  # off the sync period: the driver's model took the ranks' weights first
    init = tiny_model("llada").state_dict()
    assert any(not torch.equal(saved[k], init[k]) for k in init)
    resumed = run(tmp_path / "cut")
    assert all(torch.equal(resumed[k], v) for k, v in full.items())
    cut = [reproducible(r) for r in read_metrics(tmp_path / "cut" / "metrics.jsonl")]
    assert cut == [reproducible(r) for r in read_metrics(tmp_path / "full" / "metrics.jsonl")]
