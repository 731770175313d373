"""Parity of dllm_objectives.bridge_ratio with DARE's BridgeRatio-GRPO (CURE-RLVR).

The original is yjyddq/DARE PR #21, commit 6d4791f ("Add BridgeRatio GRPO support"):
`verl/trainer/ppo/dllm_core_algos.py` (`_cv_squared_from_log_weights`, `estimate_bridge_log_ratio`,
`compute_policy_loss_bridgeratio`) and `tests/test_bridgeratio.py`. The `_dare_*` functions are
short plain-torch transcriptions; the two `test_dare_*` cases are that file's tests, ported.
"""

from __future__ import annotations

import pytest
import torch

import dllm_objectives as do


def _dare_cv2(log_w: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """`_cv_squared_from_log_weights`."""
    w = torch.exp(log_w - log_w.max(dim=1, keepdim=True).values)
    mean = w.mean(dim=1)
    var = (w - mean.unsqueeze(1)).square().mean(dim=1)
    return var / mean.square().clamp_min(eps)


def _dare_log_ratio(new: torch.Tensor, old: torch.Tensor, correction: str = "none",
                    detach: bool = True) -> torch.Tensor:
    """`estimate_bridge_log_ratio` (without its metrics)."""
    k = new.size(1)
    log_ratio = torch.logsumexp(new, dim=1) - torch.logsumexp(old, dim=1)
    if correction in ("delta", "bias", "bias_correction"):
        term = 0.5 / max(k, 1) * (_dare_cv2(new) - _dare_cv2(old))
        log_ratio = log_ratio + (term.detach() if detach else term)
    elif correction == "jackknife" and k > 1:
        loo = []
        for idx in range(k):
            keep = [j for j in range(k) if j != idx]
            loo.append(torch.logsumexp(new[:, keep], dim=1) - torch.logsumexp(old[:, keep], dim=1))
        log_ratio = k * log_ratio - (k - 1) * torch.stack(loo, dim=1).mean(dim=1)
    elif correction == "cumulant":
        d = new - old
        w = torch.softmax(old, dim=1)
        w = w.detach() if detach else w
        mean = (w * d).sum(dim=1)
        log_ratio = mean + 0.5 * (w * (d - mean.unsqueeze(1)).square()).sum(dim=1)
    return log_ratio


def _dare_loss(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, clip: float = 0.2,
               clip_c: float = 3.0, correction: str = "none", detach: bool = True,
               log_clip: float | None = None) -> tuple[torch.Tensor, ...]:
    """`compute_policy_loss_bridgeratio`, token-mean (`verl_F.masked_mean` = sum(m v) / (sum(m) + 1e-8))."""
    def masked_mean(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (v * m).sum() / (m.sum() + 1e-8)

    log_ratio = _dare_log_ratio(new, old, correction, detach)
    if log_ratio.dim() == 1:
        log_ratio = log_ratio.unsqueeze(-1).expand_as(adv)
    rl = log_ratio if log_clip is None else log_ratio.clamp(min=-log_clip, max=log_clip)
    ratio = torch.exp(rl)
    ppo_kl = masked_mean(torch.exp(-rl) + rl - 1, mask)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    c1 = torch.maximum(pg1, pg2)
    clipfrac = masked_mean(torch.gt(pg2, pg1).float(), mask)
    pg3 = -adv * clip_c
    c2 = torch.min(pg3, c1)
    clipfrac_lower = masked_mean(torch.gt(c1, pg3) * (adv < 0).float(), mask)
    pg = torch.where(adv < 0, c2, c1)
    return masked_mean(pg, mask), clipfrac, ppo_kl, clipfrac_lower


# ---------------------------------------------------------------- DARE's tests/test_bridgeratio.py, ported

def test_dare_bridge_log_ratio_matches_coupled_logsumexp() -> None:
    current = torch.tensor([[[-1.0, -0.8], [-1.2, -0.6], [-0.9, -0.7]], [[-0.4, -1.1], [-0.3, -1.0], [-0.5, -0.9]]])
    old = torch.tensor([[[-1.1, -0.9], [-1.3, -0.5], [-1.0, -0.8]], [[-0.6, -1.0], [-0.4, -1.2], [-0.7, -0.8]]])
    log_ratio, metrics = do.bridge_log_ratio(current, old)
    expected = torch.logsumexp(current, dim=1) - torch.logsumexp(old, dim=1)
    assert torch.allclose(log_ratio, expected)
    assert metrics["bridge_num_paths"].item() == 3


def test_dare_bridge_policy_loss_is_zero_for_zero_advantage() -> None:
    current = torch.tensor([[-1.0, -1.0]])  # DARE: [[[-1.0, -1.0], [-1.0, -1.0]]], 2 paths x 2 tokens
    loss, metrics = do.bridge_ratio_policy_loss(current, current.clone(), torch.zeros(1), torch.ones(1, 2, dtype=torch.bool),
                                                clip_low=0.2, clip_high=0.2)
    assert torch.allclose(loss, torch.tensor(0.0))
    for key in ("clip_frac", "ppo_kl", "dual_clip_frac"):
        assert torch.allclose(metrics[key], torch.tensor(0.0)), key


# ---------------------------------------------------------------- against the transcription

def _paths(seed: int, b: int = 5, k: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, k, generator=g, dtype=torch.float64) * 3
    new = old + 0.4 * torch.randn(b, k, generator=g, dtype=torch.float64)
    return new, old


@pytest.mark.parametrize("correction", do.BRIDGE_CORRECTIONS)
@pytest.mark.parametrize("detach", [True, False])
def test_log_ratio_and_gradient_match_dare(correction: str, detach: bool) -> None:
    new, old = _paths(0)
    new.requires_grad_(True)
    ours, metrics = do.bridge_log_ratio(new, old, correction=correction, detach_correction=detach)
    dare = _dare_log_ratio(new, old, correction, detach)
    torch.testing.assert_close(ours.double(), dare, rtol=1e-6, atol=1e-6)
    w = torch.linspace(-1, 1, 5, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours.double() * w).sum(), new)
    (g_dare,) = torch.autograd.grad((dare * w).sum(), new)
    torch.testing.assert_close(g_ours, g_dare, rtol=1e-5, atol=1e-6)
    plain = torch.logsumexp(new, 1) - torch.logsumexp(old, 1)
    assert metrics["bridge_correction"].item() == pytest.approx(float((dare - plain).detach().mean()), abs=1e-6)


def test_jackknife_with_one_path_is_the_plain_estimate() -> None:
    new, old = _paths(1, k=1)
    ours, _ = do.bridge_log_ratio(new, old, correction="jackknife")
    torch.testing.assert_close(ours.double(), new[:, 0] - old[:, 0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("correction", "log_clip"), [("none", None), ("delta", None), ("cumulant", 0.3),
                                                      ("jackknife", None)])
def test_policy_loss_metrics_and_gradient_match_dare(correction: str, log_clip: float | None) -> None:
    new, old = _paths(2, b=6)
    new.requires_grad_(True)
    adv = torch.tensor([1.2, -0.8, 0.5, -1.5, 0.0, 0.9], dtype=torch.float64)
    mask = torch.ones(6, 4, dtype=torch.bool)
    mask[1, 2:] = False
    mask[3, 1:] = False
    loss, metrics = do.bridge_ratio_policy_loss(new, old, adv, mask, correction=correction, log_ratio_clip=log_clip)
    dare = _dare_loss(old, new, adv[:, None].expand(6, 4), mask.double(), correction=correction, log_clip=log_clip)
    assert loss.item() == pytest.approx(dare[0].item(), rel=1e-6)
    for key, ref in zip(("clip_frac", "ppo_kl", "dual_clip_frac"), dare[1:]):
        assert metrics[key].item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7), key
    (g_ours,) = torch.autograd.grad(loss, new)
    (g_dare,) = torch.autograd.grad(dare[0], new)
    torch.testing.assert_close(g_ours, g_dare, rtol=1e-5, atol=1e-7)
    assert float(g_dare.abs().sum()) > 0
