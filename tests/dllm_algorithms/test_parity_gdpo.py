"""GDPO through the model: its sequence ELBO, loss and gradients equal the authors' code, in float64.

The `_gdpo_*` functions transcribe KevinRojas1499/GDPO@1918683 (cited per function):
`NumericalIntegrationEstimator` of gdpo/likelihood_estimators.py with its random mask draw
(`forward_process`, a `torch.randperm` of `int(t * L)` completion positions) replaced by the masks of
our plan, so both sides score the same noisy copies; `GDPOTrainer.compute_loss` and the advantages of
gdpo/gdpo_trainer.py. The model is a float64 tiny LLaDA; the batch has no padding (the authors pass no
attention mask, gdpo_trainer.py:101-104) and counts every response position (their ELBO covers the
whole completion width, `eos_handling="keep"`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dllm_algorithms as da
from dllm_objectives import MaskPlan, quadrature_rule
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import LossInputs, RLBatch, Scorer, SpecialTokens
from tests.dllm_algorithms.test_parity_block import _assert_close, _grads
from tests.dllm_algorithms.test_parity_bridge_ratio import _model
from tests.dllm_models.tiny_configs import EOS, MASK
from tests.dllm_objectives.test_sdmc import _GDPO_TABLE

P, R = 5, 8
ADV = torch.tensor([0.9, -0.6, 0.3, -1.2], dtype=torch.float64)


def _gdpo_get_loss(model: torch.nn.Module, seq: torch.Tensor, prompt_len: int, mc_batch_size: int, p_mask: float,
                   is_mask: torch.Tensor) -> torch.Tensor:
    """`get_loss` (likelihood_estimators.py:292-303) with `forward_process` (:222-236) given its mask."""
    bs = seq.shape[0] // mc_batch_size
    # GDPO: likelihood_estimators.py:233-234
    is_mask = torch.cat((torch.zeros(seq.shape[0], prompt_len, dtype=torch.bool), is_mask), dim=1)
    perturbed_seq = torch.where(is_mask, MASK, seq)
    # GDPO: likelihood_estimators.py:294-301 (`loss[not_mask_index] = 0` written out of place)
    not_mask_index = (perturbed_seq != MASK).reshape(bs, mc_batch_size, -1)
    logits = model(perturbed_seq).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq.flatten(), reduction='none') / p_mask
    loss = loss.reshape(bs, mc_batch_size, -1)
    loss = loss.masked_fill(not_mask_index, 0)
    return loss.sum(dim=(1, 2)) / mc_batch_size


def _gdpo_log_likelihood(model: torch.nn.Module, seq: torch.Tensor, logits_to_keep: int, mode: str,
                         mc_batch_size: int, masks: dict[float, torch.Tensor]) -> torch.Tensor:
    """`get_log_likelihood` (likelihood_estimators.py:239-290), one batch; `masks[t]`: [B, mc, R] at node t."""
    bs, seq_len = seq.shape
    prompt_len = seq_len - logits_to_keep
    seq = seq.unsqueeze(1).repeat((1, mc_batch_size, 1)).reshape(-1, seq_len)  # :258

    def node(t: float) -> torch.Tensor:
        return _gdpo_get_loss(model, seq, prompt_len, mc_batch_size, t, masks[t].reshape(bs * mc_batch_size, -1))

    if mode == 'simpson':  # :268-277
        loss = (node(0.1) + 4 * node(0.5) + node(1.0)) / 6
    else:  # :278-286
        loss = 0
        points, weights = _GDPO_TABLE[mode]
        for point, weight in zip(points, weights):
            xi = point * .5 + .5
            loss = loss + weight * node(xi)
        loss = .5 * loss
    return -loss  # :290 (num_batches = 1)


def _gdpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor, advantages: torch.Tensor,
               completion_len: int, epsilon: float, beta: float) -> torch.Tensor:
    """`GDPOTrainer.compute_loss` (gdpo_trainer.py:105-138)."""
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1  # :108-110
    coef_1 = torch.exp((logps - old_logps) / completion_len)  # :120
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon)
    loss_1 = coef_1 * advantages
    loss_2 = coef_2 * advantages
    loss = -torch.min(loss_1, loss_2)
    if beta != 0.0:
        loss = loss + beta * kl
    return loss.mean()


def _gdpo_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """gdpo_trainer.py:473-479: reward minus the group mean, no std."""
    mean_grouped_rewards = rewards.view(-1, num_generations).mean(dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    return rewards - mean_grouped_rewards


def _batch() -> RLBatch:
    g = torch.Generator().manual_seed(4)
    b = ADV.shape[0]
    rollout = RolloutBatch(prompt_ids=torch.randint(0, 60, (b, P), generator=g),
                           prompt_mask=torch.ones(b, P, dtype=torch.bool),
                           response_ids=torch.randint(0, 60, (b, R), generator=g),
                           response_mask=torch.ones(b, R, dtype=torch.bool), seeds=torch.arange(b),
                           config=SamplingConfig(max_new_tokens=R, steps=R, block_length=R))
    return RLBatch(rollout=rollout, scores=torch.zeros(b), group_ids=torch.tensor([0, 0, 1, 1]),
                   tokens=SpecialTokens(mask_id=MASK, eos_id=EOS, pad_id=EOS))


def _node_masks(plan: MaskPlan, mc: int) -> list[torch.Tensor]:
    """Our plan's response masks per node, in node order (copies k * mc .. k * mc + mc - 1): [B, mc, R] each."""
    return [plan.mask[:, k * mc:(k + 1) * mc, P:] for k in range(plan.num_samples // mc)]


@pytest.mark.parametrize(("rule", "mc"), [("gauss-2", 1), ("gauss-3", 1), ("gauss-5", 1), ("simpson", 1),
                                          ("gauss-3", 2)])
def test_gdpo_elbo_loss_and_gradients_equal_the_authors(rule: str, mc: int) -> None:
    model, batch = _model("llada"), _batch()
    alg = da.GDPO(rule=rule, mc_samples=mc, num_iterations=1, kl_coef=0.04, clip_low=0.5, clip_high=0.5)
    plan = alg.prepare(batch, torch.Generator().manual_seed(7))[0]
    t, _ = quadrature_rule(rule)  # the authors' node times bit for bit (tests/dllm_objectives/test_sdmc.py)
    masks = {tk: m for tk, m in zip(t.tolist(), _node_masks(plan, mc))}
    assert all(int(m.sum(-1).max()) == int(tk * R) for tk, m in masks.items())  # floor(t R) per row
    ids = batch.rollout.input_ids
    theirs = _gdpo_log_likelihood(model, ids, R, rule, mc, masks)
    ours = alg.values(Scorer(model), batch, [plan], 0)
    torch.testing.assert_close(ours.double(), theirs, rtol=2e-6, atol=1e-5)

    g = torch.Generator().manual_seed(9)
    # r = exp((E - E_old) / 8): 1.65 (A > 0: clipped at 1.5), 1.28, 0.94, 0.47 (A < 0: clipped at 0.5)
    old = theirs.detach() + torch.tensor([-4.0, -2.0, 0.5, 6.0], dtype=torch.float64)
    ref = theirs.detach() + 0.5 * torch.randn(4, generator=g, dtype=torch.float64)
    gdpo_loss = _gdpo_loss(theirs, old, ref, ADV, R, epsilon=0.5, beta=0.04)
    ours_loss, metrics = alg.loss(ours, LossInputs(batch=batch, data=[plan], iteration=0, advantages=ADV, old=old,
                                                  ref=ref))
    _assert_close(ours_loss, gdpo_loss, _grads(ours_loss, model), _grads(gdpo_loss, model))
    assert "kl" in metrics and float(metrics["clip_frac"]) == pytest.approx(2 / 4)


def test_gdpo_advantages_are_reward_minus_group_mean() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 2.0])
    ours = da.GDPO().advantages(rewards, torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2]))
    assert torch.allclose(ours, _gdpo_advantages(rewards, 3))
    assert torch.equal(ours[3:6], torch.zeros(3))  # equal rewards: zero advantages, no division by a zero std


def test_gdpo_is_on_policy_at_its_first_iteration_and_draws_fresh_masks_per_iteration() -> None:
    model, batch = _model("llada"), _batch()
    alg = da.GDPO(num_iterations=3)
    data = alg.prepare(batch, torch.Generator().manual_seed(1))
    assert len(data) == 3 and not torch.equal(data[0].mask, data[1].mask)
    v = alg.values(Scorer(model), batch, data, 0)
    loss, metrics = alg.loss(v, LossInputs(batch=batch, data=data, iteration=0, advantages=ADV, old=v.detach(),
                                           ref=None))
    assert float(metrics["ratio_mean"]) == 1.0 and float(metrics["clip_frac"]) == 0.0
    assert float(loss.detach()) == pytest.approx(-float(ADV.mean()), rel=1e-6)  # -mean(A r) at r = 1


def test_gdpo_settings_are_validated() -> None:
    assert not da.GDPO().needs_reference and da.GDPO(kl_coef=0.01).needs_reference
    with pytest.raises(ValueError, match="algorithm.rule: unknown quadrature rule 'gauss-9x'"):
        da.GDPO(rule="gauss-9x")
    with pytest.raises(ValueError, match="algorithm.mc_samples must be >= 1"):
        da.GDPO(mc_samples=0)
    with pytest.raises(ValueError, match="algorithm.num_iterations must be >= 1"):
        da.GDPO(num_iterations=0)
    with pytest.raises(ValueError, match="algorithm.kl_coef must be >= 0"):
        da.GDPO(kl_coef=-0.1)
    with pytest.raises(ValueError, match="algorithm.clip_low must lie in"):
        da.GDPO(clip_low=1.5)
