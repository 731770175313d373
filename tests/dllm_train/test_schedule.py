"""Learning-rate schedules: warm-up, constant, cosine; and the workers follow them."""

from __future__ import annotations

import math

import pytest

from dllm_train import OptimConfig
from dllm_train.schedule import learning_rate


def test_constant_with_warmup_is_the_old_rule() -> None:
    cfg = OptimConfig(lr=1e-3, warmup_steps=4)
    assert [learning_rate(cfg, s) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert learning_rate(OptimConfig(lr=2e-5), 0) == 2e-5


def test_cosine_decays_to_the_floor_and_stays() -> None:
    cfg = OptimConfig(lr=1.0, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    lrs = [learning_rate(cfg, s, total_steps=12) for s in range(15)]
    assert lrs[:2] == pytest.approx([0.5, 1.0])
    assert lrs[2] == pytest.approx(1.0)  # decay starts after warm-up
    assert lrs[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert lrs[12:] == pytest.approx([0.1] * 3)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))
    # decay_steps overrides the phase length
    fixed = OptimConfig(lr=1.0, schedule="cosine", decay_steps=4)
    assert learning_rate(fixed, 4, total_steps=100) == pytest.approx(0.0)


def test_cosine_needs_a_horizon_and_bad_fields_are_named() -> None:
    with pytest.raises(ValueError, match="decay_steps"):
        learning_rate(OptimConfig(lr=1.0, schedule="cosine"), 3)
    with pytest.raises(ValueError, match="optim.schedule 'linear'"):
        OptimConfig(schedule="linear")
    with pytest.raises(ValueError, match="min_lr_ratio"):
        OptimConfig(min_lr_ratio=1.5)


def test_sft_worker_follows_the_cosine() -> None:
    import torch

    from dllm_algorithms import SFT
    from dllm_train import SFTConfig
    from tests.tiny_rl import tiny_model

    model = tiny_model("llada")
    ids = torch.randint(0, 10, (2, 6))
    attn = torch.ones(2, 6, dtype=torch.bool)
    resp = torch.zeros(2, 6, dtype=torch.bool)
    resp[:, 3:] = True
    optim = OptimConfig(lr=1e-3, warmup_steps=1, schedule="cosine")
    worker = SFT(sft=SFTConfig(steps=5, batch_size=2)).worker(model, lambda step: (ids, attn, resp), optim, steps=5,
                                                             seed=0)
    seen = []
    for step in range(5):
        worker.step(step)
        seen.append(worker.optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([learning_rate(optim, s, total_steps=5) for s in range(5)])
    assert seen[1] > seen[3] > seen[4] >= 0


def test_rl_actor_needs_decay_steps_for_a_cosine() -> None:
    from dllm_algorithms import D1
    from dllm_train import ActorWorker
    from tests.tiny_rl import tiny_model

    model = tiny_model("llada")
    with pytest.raises(ValueError, match="optim.decay_steps"):
        ActorWorker(model, D1(), OptimConfig(lr=1e-3, schedule="cosine"))
    actor = ActorWorker(model, D1(), OptimConfig(lr=1e-3, schedule="cosine", decay_steps=10))
    assert actor.optim_cfg.decay_steps == 10
