"""The in-process RL phase (`LocalRL`): one step trains, NaN guard, exact resume, consistency,
settings refused before any work."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_algorithms import BGPO, CJGRPO, D1
from dllm_rollout import SamplingConfig
from dllm_train import LocalRL, PhaseSpec, Run, check_settings, read_metrics
from tests.tiny_rl import SAMPLING, fast, local_rl, reproducible, tiny_model


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _d1(**kwargs: Any) -> tuple[LocalRL, torch.nn.Module]:
    model = tiny_model("llada")
    return local_rl(model, D1(), **kwargs), model


def test_rl_step_changes_trainable_parameters_and_reports_metrics() -> None:
    # partial credit (tiny_rl's default reward) so an untrained model's group rewards differ
    wf, model = _d1()
    before = _params(model)
    changed = False
    for step in range(4):
        metrics = wf.step(step)
        assert {"reward_mean", "loss", "clip_frac", "grad_norm", "response_length", "update_passes"} <= set(metrics)
        changed = changed or any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert changed


def test_zero_advantages_leave_weights_unchanged_direction(caplog: pytest.LogCaptureFixture) -> None:
    # with all-equal rewards GRPO advantages are 0, so the loss gradient is exactly 0
    wf, model = _d1(reward=lambda text, answer: 1.0)
    with caplog.at_level("WARNING", logger="dllm_train.step"):
        wf.step(0)
    # ... and the console says so (before: nothing did)
    assert [r.getMessage().split(";")[0] for r in caplog.records if r.name == "dllm_train.step"] == [
        "RL step 1: every group's rewards are equal (reward_mean 1), so every advantage is 0 and this step has no "
        "learning signal"]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(float(g.abs().max()) == 0.0 for g in grads)


def test_nan_loss_skips_the_step_and_keeps_weights_and_optimizer_state() -> None:
    wf, model = _d1()
    wf.step(0)
    before = _params(model)
    opt_before = {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)}
                  for k, v in wf.actor.optimizer.state_dict()["state"].items()}
    algorithm = wf.actor.algorithm
    real_loss = algorithm.loss

    def nan_loss(*args: object, **kwargs: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = real_loss(*args, **kwargs)  # type: ignore[arg-type]
        return loss * float("nan"), metrics

    object.__setattr__(algorithm, "loss", nan_loss)  # a frozen dataclass: patch this instance only
    metrics = wf.step(1)
    assert metrics["skipped"] == 1.0 and wf.actor.skipped == 1
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    opt_after = wf.actor.optimizer.state_dict()["state"]
    for k, v in opt_before.items():
        for n, t in v.items():
            assert torch.equal(t, opt_after[k][n])


def _run_rl(out: Path, steps: int, save_every: int) -> list[dict[str, object]]:
    wf, model = _d1(save_every=save_every)
    run = Run(out, model, progress=False)
    run.run_phase(PhaseSpec(order=0, name="rl", steps=steps, step_fn=wf.step, owner=wf, save_every=save_every))
    return read_metrics(out / "metrics.jsonl")


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path: Path) -> None:
    straight = _run_rl(tmp_path / "a", steps=6, save_every=0)
    # interrupted: the first process stops after step 3 (its last checkpoint), a new one resumes
    _run_rl(tmp_path / "b", steps=3, save_every=0)
    resumed = _run_rl(tmp_path / "b", steps=6, save_every=0)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(straight, resumed):
        assert reproducible(x) == reproducible(y)


def test_consistency_metric_is_reported_and_exact_without_cache() -> None:
    wf, model = _d1(sampling=dataclasses.replace(SAMPLING, record_trajectory=True), consistency_every=1)
    before = _params(model)
    for step in range(3):
        metrics = wf.step(step)
        assert metrics["consistency_num_tokens"] > 0
        # no cache: the replay is the same computation as the rollout, with the same weights
        assert metrics["consistency_max_abs_gap"] < 1e-4
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # updates happened


def test_consistency_without_trajectories_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="rollout.record_trajectory=true"):
        _d1(sampling=dataclasses.replace(SAMPLING, record_trajectory=False), consistency_every=5)


def test_tensorboard_events_are_written(tmp_path: Path) -> None:
    wf, model = _d1()
    run = Run(tmp_path, model, progress=False, tensorboard=True)
    run.run_phase(PhaseSpec(order=0, name="rl", steps=2, step_fn=wf.step, owner=wf))
    events = list((tmp_path / "tensorboard" / "rl").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_token_editing_is_refused_where_trajectories_are_replayed() -> None:
    editing = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0, block_diffusion=True,
                             threshold=0.9, editing_threshold=0.5)
    with pytest.raises(ValueError, match="CJGRPO.*editing_threshold"):
        local_rl(tiny_model("sdar"), CJGRPO(), sampling=editing)
    # the consistency replay reads the trajectory too (the same check runs on every backend)
    with pytest.raises(ValueError, match="consistency_every=2.*editing_threshold"):
        check_settings(BGPO(), dataclasses.replace(editing, record_trajectory=True), consistency_every=2)
    wf = local_rl(tiny_model("sdar"), fast(BGPO()), sampling=editing)  # no trajectory read: allowed
    assert wf.rank.rollout.sampling.editing_threshold == 0.5
    assert wf.rank.consistency_every == 0


class _ShardedOwner:
    """A `ShardedStateful` owner whose 'ranks' write one file per checkpoint into `shards/`."""

    def __init__(self, fail: bool = False) -> None:
        self.value, self.fail, self.loaded_from = 0, fail, None

    def step(self, i: int) -> dict[str, float]:
        self.value += 1
        return {"loss": float(i)}

    def state(self) -> dict[str, Any]:
        return {"counter": self.value}

    def load_state(self, state: dict[str, Any]) -> None:
        self.value = int(state["counter"])

    def save_shards(self, folder: Path) -> None:
        if self.fail:
            raise OSError("no space left on device")
        folder.mkdir()
        (folder / "rank0.bin").write_text(str(self.value))

    def load_shards(self, folder: Path) -> None:
        self.loaded_from = folder
        assert (folder / "rank0.bin").read_text() == str(self.value)


def test_a_sharded_owner_writes_its_shards_into_the_checkpoint_and_resumes_from_them(tmp_path: Path) -> None:
    from dllm_train import ShardedStateful

    owner = _ShardedOwner()
    assert isinstance(owner, ShardedStateful)
    Run(tmp_path, tiny_model("llada"), progress=False).run_phase(
        PhaseSpec(order=0, name="rl", steps=2, step_fn=owner.step, owner=owner))
    ckpt = tmp_path / "checkpoints" / "0-rl-000002"
    assert (ckpt / "shards" / "rank0.bin").read_text() == "2"
    fresh = _ShardedOwner()
    Run(tmp_path, tiny_model("llada"), progress=False).run_phase(
        PhaseSpec(order=0, name="rl", steps=3, step_fn=fresh.step, owner=fresh))
    assert fresh.loaded_from == ckpt / "shards" and fresh.value == 3  # resumed at 2, ran step 3
    # a plain owner (the local backend) cannot take the ranks' shards
    wf, model = _d1()
    with pytest.raises(ValueError, match="trainer.backend=ray"):
        Run(tmp_path, model, progress=False).run_phase(
            PhaseSpec(order=0, name="rl", steps=4, step_fn=wf.step, owner=wf))


def test_a_failed_shard_write_leaves_no_partial_checkpoint(tmp_path: Path) -> None:
    owner = _ShardedOwner(fail=True)
    with pytest.raises(OSError, match="could not write the checkpoint"):
        Run(tmp_path, tiny_model("llada"), progress=False).run_phase(
            PhaseSpec(order=0, name="rl", steps=1, step_fn=owner.step, owner=owner))
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_greedy_rollouts_are_refused_since_their_gradient_is_identically_zero() -> None:
    # temperature 0 + low-confidence unmasking: the G samples of a prompt are one response, so
    # group-relative advantages are all 0 (before: loss 0 and grad norm 0 every step, no warning)
    greedy = dataclasses.replace(SAMPLING, temperature=0.0)
    with pytest.raises(ValueError, match=r"rollout.temperature=0 .*identically zero.*rollout.temperature > 0"):
        check_settings(D1(), greedy, consistency_every=0)
    check_settings(D1(), dataclasses.replace(greedy, remasking="random"), consistency_every=0)  # seeds still differ
