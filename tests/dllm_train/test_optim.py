"""One optimizer step for RL, SFT and preference: clip, schedule on the update counter, non-finite skip."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from dllm_algorithms import SFT
from dllm_train import OptimConfig, derive_seed
from dllm_train.optim import OptimizerStep
from dllm_train.schedule import learning_rate
from tests.dllm_train.distributed_helpers import run_ranks
from tests.dllm_train.helpers import sft_batch
from tests.tiny_rl import tiny_model


def _linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def _backward(model: torch.nn.Module, scale: float = 1.0) -> torch.Tensor:
    x = torch.arange(8.0).reshape(2, 4)
    loss = model(x).pow(2).sum() * scale
    loss.backward()
    return loss.detach()


def test_a_finite_step_is_clip_then_scheduled_adamw() -> None:
    # the reference: the step the SFT worker made before this component (clip, lr of step, AdamW)
    cfg = OptimConfig(lr=1e-2, warmup_steps=3, grad_clip=0.5, weight_decay=0.1)
    model, ref = _linear(), _linear()
    opt = OptimizerStep(model, cfg, horizon=10)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    for step in range(4):
        opt.zero_grad()
        out = opt.step(_backward(model))
        ref_opt.zero_grad()
        _backward(ref)
        norm = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), cfg.grad_clip)
        for g in ref_opt.param_groups:
            g["lr"] = learning_rate(cfg, step, total_steps=10)
        ref_opt.step()
        assert out["optimizer_steps"] == 1.0 and out["skipped"] == 0.0
        assert out["grad_norm"] == pytest.approx(float(norm))
        assert out["lr"] == pytest.approx(learning_rate(cfg, step, total_steps=10))
        for a, b in zip(model.parameters(), ref.parameters()):
            assert torch.equal(a, b)
    assert opt.updates == 4 and opt.skipped == 0


@pytest.mark.parametrize("poison", ["loss", "gradient"])
def test_a_non_finite_step_changes_nothing_and_the_schedule_waits(poison: str) -> None:
    cfg = OptimConfig(lr=1e-2, warmup_steps=4)
    model = _linear()
    opt = OptimizerStep(model, cfg)
    opt.zero_grad()
    opt.step(_backward(model))
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(opt.optimizer.state_dict())
    opt.zero_grad()
    loss = _backward(model, scale=float("inf") if poison == "gradient" else 1.0)
    out = opt.step(float("nan") if poison == "loss" else loss)
    assert out["skipped"] == 1.0 and out["optimizer_steps"] == 0.0
    assert all(p.grad is None for p in model.parameters())  # cleared for the next step
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    assert opt.optimizer.state_dict()["state"][0]["step"] == state["state"][0]["step"]
    assert (opt.updates, opt.skipped) == (1, 1)
    assert opt.lr() == pytest.approx(learning_rate(cfg, 1))  # the skipped step did not advance it


def test_called_several_times_per_step_it_counts_every_update() -> None:
    cfg = OptimConfig(lr=1.0, schedule="cosine", decay_steps=4)
    model = _linear()
    opt = OptimizerStep(model, cfg)
    lrs = []
    for _ in range(3):
        opt.zero_grad()
        lrs.append(opt.step(_backward(model))["lr"])
    assert opt.updates == 3
    assert lrs == pytest.approx([learning_rate(cfg, k) for k in range(3)])


def test_state_round_trips_and_old_states_take_adams_step_count() -> None:
    model = _linear()
    opt = OptimizerStep(model, OptimConfig())
    for _ in range(2):
        opt.zero_grad()
        opt.step(_backward(model))
    again = OptimizerStep(copy.deepcopy(model), OptimConfig())
    again.load_state(opt.state())
    assert (again.updates, again.skipped) == (2, 0)
    legacy = OptimizerStep(copy.deepcopy(model), OptimConfig())
    legacy.load_state({"optimizer": opt.optimizer.state_dict()})  # an SFT checkpoint of before
    assert legacy.updates == 2


def _one_rank_poisoned(rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    model = _linear()
    opt = OptimizerStep(model, OptimConfig(), group=dist.group.WORLD)
    opt.zero_grad()
    loss = _backward(model)
    return opt.step(float("nan") if rank == 1 else loss)


def test_ranks_skip_together_when_one_rank_is_non_finite() -> None:
    outs = run_ranks(_one_rank_poisoned)
    assert [o["skipped"] for o in outs] == [1.0, 1.0]


def test_sft_and_preference_steps_report_their_optimizer_steps() -> None:
    model = tiny_model("llada")
    cfg = OptimConfig(lr=1e-3, warmup_steps=5)
    worker = SFT().worker(model, lambda s: sft_batch(4, derive_seed(0, "sft", s)), cfg, steps=5, seed=0)
    out = worker.step(0)
    assert out["optimizer_steps"] == 1.0 and out["skipped"] == 0.0 and math.isfinite(out["grad_norm"])
    real = worker.optim.optimizer.step

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("a NaN step must not reach AdamW")

    worker.optim.optimizer.step = boom  # type: ignore[method-assign]
    with torch.no_grad():
        p = next(p for p in model.parameters() if p.requires_grad)
        saved = p.clone()
        p.fill_(float("nan"))
    assert worker.step(1)["skipped"] == 1.0
    with torch.no_grad():
        p.copy_(saved)
    worker.optim.optimizer.step = real  # type: ignore[method-assign]
    # one counter: the skipped step did not advance the warm-up (the old SFT step used the step index)
    assert worker.optim.lr() == pytest.approx(learning_rate(cfg, 1))
