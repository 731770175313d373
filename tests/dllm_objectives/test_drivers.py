"""Tests for dllm_objectives.drivers: model-in-the-loop protocols equal plain autograd."""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def _toy_model() -> torch.nn.Linear:
    model = torch.nn.Linear(4, 3)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 4, generator=g))
        model.bias.copy_(torch.randn(3, generator=g))
    return model


def test_proxy_backward_equals_direct_autograd() -> None:
    x = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(1))  # [M, B, feat]
    old, adv = torch.tensor([-0.2, 0.1]), torch.tensor([1.0, -0.5])

    def value(model: torch.nn.Linear, m: int) -> torch.Tensor:
        return torch.log_softmax(model(x[m]), -1)[:, 0]

    def objective(v: torch.Tensor) -> torch.Tensor:
        return do.sequence_clip_loss(v, old, adv, clip_low=0.2, clip_high=0.2)[0]

    direct = _toy_model()
    loss = objective(torch.stack([value(direct, m) for m in range(3)]).mean(0))
    loss.backward()
    proxy = _toy_model()
    out = do.proxy_backward(objective, [lambda m=m: value(proxy, m) for m in range(3)])
    assert out.item() == pytest.approx(loss.item())
    for p, q in zip(direct.parameters(), proxy.parameters()):
        assert p.grad is not None and q.grad is not None
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_per_sample_backward_equals_mean_loss_and_step_replay_equals_sum() -> None:
    x = torch.randn(4, 2, 4, generator=torch.Generator().manual_seed(2))
    full = _toy_model()
    losses = [full(x[i]).pow(2).mean() for i in range(4)]
    (sum(losses) / 4).backward()  # type: ignore[operator]
    acc = _toy_model()
    total = do.per_sample_backward([lambda i=i: acc(x[i]).pow(2).mean() for i in range(4)])
    assert total.item() == pytest.approx(sum(v.item() for v in losses) / 4, rel=1e-6)
    for p, q in zip(full.parameters(), acc.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)  # type: ignore[arg-type]
    chunked = _toy_model()
    total = do.step_replay(lambda k: chunked(x[k]).pow(2).mean() / 4, 4)
    for p, q in zip(full.parameters(), chunked.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)  # type: ignore[arg-type]


def test_bgpo_per_sample_accumulation_gradient_equals_exp_ratio_on_policy() -> None:
    # BGPO protocol on-policy: sum_i loss_i / N has the gradient of the exp-ratio surrogate of the mean
    x = torch.randn(3, 2, 4, generator=torch.Generator().manual_seed(3))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 5, dtype=torch.bool)

    def value(model: torch.nn.Linear, i: int) -> torch.Tensor:
        return torch.log_softmax(model(x[i]), -1)[:, 1]

    a = _toy_model()
    do.per_sample_backward([
        lambda i=i: do.bgpo_policy_loss(value(a, i), value(a, i).detach(), adv, mask)[0] for i in range(3)
    ])
    b = _toy_model()
    mean_v = torch.stack([value(b, i) for i in range(3)]).mean(0)
    do.sequence_clip_loss(mean_v, mean_v.detach(), adv)[0].backward()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loss_fns"):
        do.per_sample_backward([])
