"""ESPO's and EBPO's sequence losses (policy term, KL, `clip_frac`) against DARE's, in float64.

The `_dare_*` functions transcribe yjyddq/DARE at 83ae8a3, verl/trainer/ppo/dllm_core_algos.py
(cited per function) and the actors that combine them (verl/workers/actor/llada_dp_actor_espo.py:
497-524, verl/workers/actor/ebpo_actor_mixin.py:190-222). Both sides get the same sequence values
(ESPO: ELBO / R; EBPO: composite ELBO), old and reference values and advantages; losses, gradients
with respect to the values, and the clip fraction are compared. The values' own gradients into
the model are the ELBO estimators', tested apart (test_parity_block.py, docs/algorithms.md#espo).
"""

from __future__ import annotations

import pytest
import torch

import dllm_algorithms as da
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import LossInputs, RLBatch, SpecialTokens

R = 6
# sequence 2 has A = 0 and a ratio outside the clip range; 0 is high-clipped with A > 0, 4 low-clipped with A < 0
ADV = torch.tensor([0.8, -0.5, 0.0, 1.1, -0.9, 0.0], dtype=torch.float64)
SHIFT = torch.tensor([0.5, 0.05, 0.6, 0.1, -0.4, 0.02], dtype=torch.float64)  # value - old


def _masked_sequence_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    # DARE: dllm_core_algos.py:228-230
    response_mask = response_mask.to(dtype=values.dtype)
    return (values * response_mask).sum(dim=-1) / response_mask.sum(dim=-1).clamp_min(1.0)


def _dare_espo_pg(old_l_theta: torch.Tensor, l_theta: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    # DARE: dllm_core_algos.py:233-282 (compute_policy_loss_espo)
    old_seq_logp = _masked_sequence_mean(old_l_theta, response_mask)
    seq_logp = _masked_sequence_mean(l_theta, response_mask)
    seq_advantages = _masked_sequence_mean(advantages, response_mask)
    log_ratio = seq_logp - old_seq_logp
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - clip, 1 + clip)
    pg_losses = torch.maximum(-seq_advantages * ratio, -seq_advantages * clipped_ratio)
    is_low_clipped = (ratio < 1 - clip) & (seq_advantages < 0)
    is_high_clipped = (ratio > 1 + clip) & (seq_advantages > 0)
    return pg_losses.mean(), (is_low_clipped | is_high_clipped).float().mean()


def _dare_espo_kl(sequence_elbo: torch.Tensor, ref_sequence_elbo: torch.Tensor, normalization_length: int,
                  kl_estimator: str) -> torch.Tensor:
    # DARE: dllm_core_algos.py:285-319 (compute_espo_kl)
    log_ratio = sequence_elbo - ref_sequence_elbo
    if kl_estimator in ("kl", "k1"):
        kl = log_ratio + (sequence_elbo - sequence_elbo.detach()) * (sequence_elbo.detach() - ref_sequence_elbo)
    elif kl_estimator in ("mse", "k2"):
        kl = 0.5 * log_ratio.square()
    else:
        assert kl_estimator in ("low_var_kl", "k3")
        kl = torch.exp(-log_ratio) + log_ratio - 1
    return kl / normalization_length


def _dare_ebpo_pg(old_l_theta: torch.Tensor, l_theta: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    # DARE: dllm_core_algos.py:199-225 (compute_policy_loss_ebpo, float64 work dtype)
    valid = response_mask.bool()
    log_ratio = l_theta[valid] - old_l_theta[valid]
    valid_advantages = advantages[valid]
    log_clip_low = torch.log1p(log_ratio.new_tensor(-clip))
    log_clip_high = torch.log1p(log_ratio.new_tensor(clip))
    effective_log_ratio = torch.where(valid_advantages >= 0, torch.minimum(log_ratio, log_clip_high),
                                      torch.maximum(log_ratio, log_clip_low))
    pg_loss = (-valid_advantages * torch.exp(effective_log_ratio)).mean()
    is_low_clipped = (log_ratio < log_clip_low) & (valid_advantages < 0)
    is_high_clipped = (log_ratio > log_clip_high) & (valid_advantages > 0)
    return pg_loss, (is_low_clipped | is_high_clipped).float().mean()


def _dare_ebpo_kl(sequence_elbo: torch.Tensor, ref_sequence_elbo: torch.Tensor, kl_estimator: str) -> torch.Tensor:
    # DARE: dllm_core_algos.py:868-885 (compute_ebpo_kl): no gradient correction for k1
    log_ratio = sequence_elbo - ref_sequence_elbo
    if kl_estimator in ("kl", "k1"):
        return log_ratio
    if kl_estimator in ("mse", "k2"):
        return 0.5 * log_ratio.square()
    return torch.exp(-log_ratio) + log_ratio - 1


def _batch(block: bool, counted: torch.Tensor) -> RLBatch:
    b = counted.shape[0]
    cfg = SamplingConfig(max_new_tokens=R, steps=R, block_length=2 if block else R, block_diffusion=block)
    rollout = RolloutBatch(prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.bool),
                           response_ids=torch.ones(b, R, dtype=torch.long), response_mask=counted,
                           seeds=torch.arange(b), config=cfg)
    return RLBatch(rollout=rollout, scores=torch.zeros(b), group_ids=torch.zeros(b, dtype=torch.long),
                   tokens=SpecialTokens(mask_id=9, eos_id=8, pad_id=8))


def _values() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    value = (-torch.rand(6, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    old = value.detach() - SHIFT
    ref = value.detach() - 0.3 * torch.randn(6, generator=g, dtype=torch.float64)
    return value, old, ref


@pytest.mark.parametrize("kl_kind", ["k1", "kl", "k2", "k3"])
def test_espo_loss_gradient_and_clip_frac_equal_dare(kl_kind: str) -> None:
    """Row 8 (k1: gradient (1 + Delta) grad E / R) and row 9 (A = 0 never counted as clipped)."""
    counted = torch.ones(6, R, dtype=torch.bool)
    value, old, ref = _values()
    coef, clip = 0.05, 0.2
    # DARE's ESPO actor (llada_dp_actor_espo.py:497-524): the values expanded over the response,
    # policy loss + coef * mean_B compute_espo_kl(proxy * R, ref * R, R)
    expand = lambda v: v[:, None].expand(-1, R)  # noqa: E731
    dare_pg, dare_cf = _dare_espo_pg(expand(old), expand(value), expand(ADV), counted, clip)
    dare_loss = dare_pg + coef * _dare_espo_kl(value * R, ref * R, R, kl_estimator=kl_kind).mean()
    (dare_g,) = torch.autograd.grad(dare_loss, value)

    alg = da.ESPO(mc_num=1, num_iterations=1, kl_coef=coef, kl_kind=kl_kind, clip_low=clip, clip_high=clip)
    ours_loss, metrics = alg.loss(value, LossInputs(batch=_batch(False, counted), data=[], iteration=0,
                                                    advantages=ADV, old=old, ref=ref))
    (ours_g,) = torch.autograd.grad(ours_loss, value)
    assert ours_loss.item() == pytest.approx(dare_loss.item(), rel=1e-6)
    torch.testing.assert_close(ours_g, dare_g, rtol=1e-5, atol=1e-9)
    assert float(metrics["clip_frac"]) == pytest.approx(float(dare_cf))
    assert float(dare_cf) == pytest.approx(2 / 6)  # sequences 0 and 4; sequence 2 (A = 0) is not counted


def test_espo_k1_gradient_is_one_plus_delta_times_grad_e() -> None:
    """The k1 gradient by hand: d/dv [coef * mean_B (1 + Delta_b) ... ] = coef (1 + Delta_b) R / (B R)."""
    counted = torch.ones(6, R, dtype=torch.bool)
    value, _, ref = _values()
    alg = da.ESPO(mc_num=1, num_iterations=1, kl_coef=1.0, kl_kind="k1")
    zero = torch.zeros(6, dtype=torch.float64)
    loss, _ = alg.loss(value, LossInputs(batch=_batch(False, counted), data=[], iteration=0, advantages=zero,
                                         old=value.detach(), ref=ref))
    (g,) = torch.autograd.grad(loss, value)
    delta = (value.detach() - ref) * R  # E - E_ref on raw ELBOs
    torch.testing.assert_close(g, (1 + delta) / 6, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("kl_kind", ["k1", "k2"])
def test_ebpo_loss_gradient_and_clip_frac_equal_dare(kl_kind: str) -> None:
    """Row 9 for EBPO (mean over valid sequences; A = 0 not counted) and its k1 without correction."""
    counted = torch.ones(6, R, dtype=torch.bool)
    counted[5] = False  # EOS first: not a valid sequence
    value, old, ref = _values()
    coef, clip = 0.05, 0.2
    sample_mask = counted.any(-1)
    # DARE's EBPO actor (ebpo_actor_mixin.py:190-222): policy loss + coef * mean over valid of the KL
    dare_pg, dare_cf = _dare_ebpo_pg(old, value, ADV, sample_mask, clip)
    dare_loss = dare_pg + coef * _dare_ebpo_kl(value, ref, kl_kind)[sample_mask].mean()
    (dare_g,) = torch.autograd.grad(dare_loss, value)

    alg = da.EBPO(mc_num=1, kl_coef=coef, kl_kind=kl_kind, clip_low=clip, clip_high=clip)
    ours_loss, metrics = alg.loss(value, LossInputs(batch=_batch(True, counted), data=None, iteration=0,
                                                    advantages=ADV, old=old, ref=ref))
    (ours_g,) = torch.autograd.grad(ours_loss, value)
    assert ours_loss.item() == pytest.approx(dare_loss.item(), rel=1e-6)
    torch.testing.assert_close(ours_g, dare_g, rtol=1e-5, atol=1e-9)
    assert float(metrics["clip_frac"]) == pytest.approx(float(dare_cf))
    assert float(dare_cf) == pytest.approx(2 / 5)
