"""`Run` under faults: a preemption signal checkpoints and stops; non-finite steps never reach a checkpoint."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_train import OptimConfig, PhaseSpec, Run, latest_checkpoint, list_checkpoints, read_metrics
from dllm_train.optim import OptimizerStep
from dllm_train import preemption
from dllm_train.preemption import Diverged, Interrupted
from tests.tiny_rl import tiny_model


class _Toy:
    """A phase whose step `i` pulls the weights toward i (AdamW); `poison(i)` makes step i non-finite."""

    def __init__(self, model: torch.nn.Module, poison: Any = None, on_step: Any = None) -> None:
        self.model = model
        self.optim = OptimizerStep(model, OptimConfig(lr=1e-2))
        self.poison = poison or (lambda i: False)
        self.on_step = on_step or (lambda i: None)

    def step(self, i: int) -> dict[str, float]:
        self.on_step(i)
        self.optim.zero_grad()
        loss = sum(((p - float(i)) ** 2).mean() for p in self.model.parameters())
        assert isinstance(loss, torch.Tensor)
        if self.poison(i):
            loss = loss * float("nan")
        loss.backward()
        return {"loss": float(loss.detach()), **self.optim.step(float(loss.detach()))}

    def state(self) -> dict[str, Any]:
        return self.optim.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.optim.load_state(state)


def _phase(toy: _Toy, steps: int = 6, save_every: int = 0) -> PhaseSpec:
    return PhaseSpec(order=0, name="sft", steps=steps, step_fn=toy.step, owner=toy, save_every=save_every)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_the_rerun_resumes_exactly(
        signum: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = tiny_model("llada")
    Run(tmp_path / "full", full, progress=False).run_phase(_phase(_Toy(full)))

    model = tiny_model("llada")
    toy = _Toy(model, on_step=lambda i: os.kill(os.getpid(), signum) if i == 2 else None)
    outer = signal.getsignal(signal.SIGINT)  # Ray, if started earlier in this process, has its own
    signal.signal(signal.SIGINT, signal.default_int_handler)  # so the handler restored below raises
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as err:
        Run(tmp_path / "cut", model, progress=False).run_phase(_phase(toy))
    assert err.value.exit_code == 128 + signum
    assert err.value.checkpoint is not None and err.value.checkpoint.name == "0-sft-000003"  # step 3 finished
    os.kill(os.getpid(), signum)  # its late duplicate (`uv run` forwarding it, ~0.2 s on) is dropped
    try:
        assert signal.getsignal(signal.SIGTERM if signum == signal.SIGINT else signal.SIGINT) in before
        if signum == signal.SIGINT:  # after the window the previous handler is back, for good
            monkeypatch.setattr(preemption, "DUPLICATE_WINDOW_S", 0.0)
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
            assert signal.getsignal(signal.SIGINT) == before[1]
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, outer)

    again = tiny_model("llada")
    run = Run(tmp_path / "cut", again, progress=False)
    assert run.latest is not None and run.latest.step == 3
    run.run_phase(_phase(_Toy(again)))
    assert all(torch.equal(v, full.state_dict()[k]) for k, v in _weights(again).items())
    assert [r["step"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_a_second_signal_stops_at_once_without_claiming_a_checkpoint(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "DUPLICATE_WINDOW_S", 0.0)  # as if sent more than the window apart
    model = tiny_model("llada")

    def twice(i: int) -> None:
        if i == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as err:
        Run(tmp_path, model, progress=False).run_phase(_phase(_Toy(model, on_step=twice)))
    assert err.value.checkpoint is None and list_checkpoints(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_delivered_twice_at_once_is_one_request(signum: int, tmp_path: Path) -> None:
    # before: the copy `uv run` forwards of what the process group already received meant "stop now",
    # so Ctrl-C through `uv run apps/dare train` and a scheduler's group SIGTERM lost the checkpoint
    model = tiny_model("llada")
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def doubled(i: int) -> None:
        if i == 1:
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)

    try:
        with pytest.raises(Interrupted) as err:
            Run(tmp_path, model, progress=False).run_phase(_phase(_Toy(model, on_step=doubled)))
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert err.value.checkpoint is not None and err.value.checkpoint.name == "0-sft-000002"


def test_non_finite_steps_in_a_row_stop_the_run_without_saving(tmp_path: Path) -> None:
    model = tiny_model("llada")
    toy = _Toy(model, poison=lambda i: i >= 2)
    with pytest.raises(Diverged, match=r"3 steps in a row had a non-finite loss.*trainer.max_nonfinite_steps=3"):
        Run(tmp_path, model, progress=False, max_nonfinite_steps=3).run_phase(_phase(toy, steps=10, save_every=2))
    # steps 3-5 were skipped: the weights of step 2 (checkpoint 2) gave no finite step, so it is set
    # aside (renamed) and a rerun starts from an earlier one, here from scratch; step 4's periodic
    # checkpoint (the same weights) is not written while the weights are suspect
    assert list_checkpoints(tmp_path) == []
    aside = sorted(p.name.split(".")[0] for p in (tmp_path / "checkpoints").iterdir())
    assert aside == ["0-sft-000002"]
    assert toy.optim.updates == 2 and toy.optim.skipped == 3
    assert [r["skipped"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 0, 1, 1, 1]


def test_a_run_stopped_by_diverged_weights_resumes_from_the_last_confirmed_checkpoint(tmp_path: Path) -> None:
    # issue #38 T1: the skipped steps kept writing checkpoints of the suspect weights, which pruned
    # (keep_checkpoints=2) every checkpoint before them; all were then set aside and the rerun
    # started over. Steps 1-3 finite (checkpoints 1-3), 4-6 non-finite with the weights of update 3.
    model = tiny_model("llada")
    with pytest.raises(Diverged, match="3 steps in a row had a non-finite loss or gradient norm with finite rewards"):
        Run(tmp_path, model, progress=False, keep_checkpoints=2).run_phase(
            _phase(_Toy(model, poison=lambda i: i >= 3), steps=10, save_every=1))
    assert [r.step for r in list_checkpoints(tmp_path)] == [2]  # 3 set aside, 2 kept: its weights gave a finite step
    resumed = tiny_model("llada", seed=1)
    run = Run(tmp_path, resumed, progress=False, keep_checkpoints=2)
    assert run.latest is not None and run.latest.step == 2


def test_non_finite_logits_in_a_step_stop_the_run_like_non_finite_steps(tmp_path: Path) -> None:
    # issue #38 "Also": rl_optim.lr=1e9 sends the weights to ~1e9; the next rollout's logits overflow
    # and its decoder raised a RuntimeError, a traceback instead of one line. Update 3 poisons here.
    from dllm_rollout import NonFiniteLogits

    model = tiny_model("llada")
    toy = _Toy(model)

    def step(i: int) -> dict[str, float]:
        if i == 3:
            raise NonFiniteLogits("block [4, 8) still has masked positions after 4 steps: the model's logits are "
                                  "not finite (NaN or inf)")
        return toy.step(i)

    spec = PhaseSpec(order=0, name="rl", steps=6, step_fn=step, owner=toy, save_every=1)
    with pytest.raises(Diverged, match=r"rl step 4: the model's logits were not finite with the weights of rl step 3 "
                                       r"\(block \[4, 8\).*set aside 1 checkpoint.*0-rl-000002.*learning rate"):
        Run(tmp_path, model, progress=False, keep_checkpoints=3).run_phase(spec)
    assert [r.step for r in list_checkpoints(tmp_path)] == [1, 2]


class _Rewards:
    """A reward function that returns NaN for every row from call `bad_from` on (rows 8 per step)."""

    def __init__(self, bad_from: int) -> None:
        self.calls, self.bad_from = 0, bad_from

    def __call__(self, text: str, answer: str) -> float:
        from tests.tiny_rl import partial_reward

        self.calls += 1
        return float("nan") if self.calls > self.bad_from else partial_reward(text, answer)


def test_nan_rewards_skip_the_step_name_the_rows_and_set_nothing_aside(tmp_path: Path, caplog: Any) -> None:
    # issue #38 T1: NaN rewards gave a NaN loss, which the guard blamed on the weights: it set aside
    # every RL checkpoint (finite, unchanged weights), the rerun started over, and the message
    # blamed the learning rate. Steps 1-2 score, steps 3-5 get NaN rewards (8 rows per step).
    from dllm_algorithms import D1
    from tests.tiny_rl import local_rl

    model = tiny_model("llada")
    rl = local_rl(model, D1(), reward=_Rewards(bad_from=16), lr=1e-2)
    spec = PhaseSpec(order=0, name="rl", steps=8, step_fn=rl.step, owner=rl, save_every=1)
    with caplog.at_level("WARNING"), pytest.raises(Diverged) as err:
        Run(tmp_path, model, progress=False, keep_checkpoints=2).run_phase(spec)
    msg = str(err.value)
    assert "3 steps in a row were skipped for a non-finite reward" in msg and "reward non-finite in 8 row(s)" in msg
    assert "the reward function returned NaN" in msg and "nothing was set aside" in msg
    assert "learning rate" not in msg and "0-rl-000004" in msg  # the rerun's starting point
    named = [r.getMessage() for r in caplog.records if "reward non-finite in rows" in r.getMessage()]
    assert len(named) == 3 and "rows 0 ('" in named[0] and ": nan)" in named[0]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if ".damaged-" in p.name]
    refs = list_checkpoints(tmp_path)
    assert [r.step for r in refs] == [3, 4]  # skipped steps still checkpoint: the weights are those of step 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["skipped"] for r in records] == [0, 0, 1, 1, 1] and records[2]["reward_nonfinite"] == 8
    assert rl.actor.updates == 2  # no update from a NaN batch
    trained = _weights(model)
    resumed = tiny_model("llada", seed=1)
    run = Run(tmp_path, resumed, progress=False)  # a rerun resumes from the newest checkpoint, not from scratch
    assert run.latest is not None and run.latest.step == 4
    assert all(torch.equal(trained[k], v) for k, v in resumed.state_dict().items())


def test_a_skip_followed_by_a_finite_step_resets_the_count(tmp_path: Path) -> None:
    model = tiny_model("llada")
    toy = _Toy(model, poison=lambda i: i in (1, 2, 4, 5))
    Run(tmp_path, model, progress=False, max_nonfinite_steps=3).run_phase(_phase(toy, steps=7))
    assert toy.optim.skipped == 4


def test_non_finite_weights_are_never_checkpointed(tmp_path: Path) -> None:
    model = tiny_model("llada")

    def poison_weights(i: int) -> None:
        if i == 3:
            with torch.no_grad():
                next(model.parameters()).fill_(float("inf"))

    toy = _Toy(model, on_step=poison_weights)
    with pytest.raises(Diverged, match="holds non-finite values, so no checkpoint is written.*0-sft-000002"):
        Run(tmp_path, model, progress=False).run_phase(_phase(toy, steps=6, save_every=2))
    ref = latest_checkpoint(tmp_path)
    assert ref is not None and ref.step == 2


def test_max_nonfinite_steps_is_validated() -> None:
    from dllm_train import TrainerConfig

    with pytest.raises(ValueError, match="trainer.max_nonfinite_steps must be >= 1"):
        TrainerConfig(max_nonfinite_steps=0)


_UNDER_UV = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from dllm_train import PhaseSpec, Run
from dllm_train.preemption import Interrupted
from tests.dllm_train.test_run_faults import _Toy
from tests.tiny_rl import tiny_model
model = tiny_model("llada")
toy = _Toy(model, on_step=lambda i: (print("step", i, flush=True), time.sleep(1.5)))  # a step waiting on I/O
try:
    Run(Path(sys.argv[1]), model, progress=False).run_phase(
        PhaseSpec(order=0, name="sft", steps=100, step_fn=toy.step, owner=toy))
except Interrupted as err:
    print("checkpoint", err.checkpoint.name if err.checkpoint else None, flush=True)
    sys.exit(err.exit_code)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_process_group_of_uv_run_is_one_request(signum: int, tmp_path: Path) -> None:
    # before: `uv run` forwards to its child what the group already received (SIGINT ~0.2 s later,
    # SIGTERM at once); the copy meant "stop now": no checkpoint, or a traceback once the step ended
    import shutil
    import subprocess

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    (tmp_path / "under_uv.py").write_text(_UNDER_UV)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([uv, "run", "--no-sync", "python", str(tmp_path / "under_uv.py"), str(tmp_path / "run"),
                             str(root)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) != "step 1\n":  # step 0 is done, step 1 under way
        assert line, proc.communicate(timeout=60)[1]
    os.killpg(proc.pid, signum)  # as a terminal (Ctrl-C) and a scheduler (Slurm) send it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, err
    assert out.splitlines()[-1] == "checkpoint 0-sft-000002", err  # the step under way finished and was saved
