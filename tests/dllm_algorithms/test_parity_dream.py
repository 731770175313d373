"""Parity of Dream's likelihood (its logit shift) and losses with DARE's code.

Dream predicts token j from position j - 1. DARE (yjyddq/DARE at commit 83ae8a3) packs each
sample's valid tokens into one row (`llada_dp_actor_d1.py` / `llada_dp_actor_bgpo.py`
`_forward_micro_batch`), runs the model on the packed row with `cu_seqlens`, shifts the logits of
the whole packed row by one (`verl/workers/actor/mdlm_sp_utils.py` `get_packed_logits`,
`shift_logits=True`, used by `dream_dp_actor_d1.py` and `dream_dp_actor_bgpo.py`), scatters them
back to the padded positions and takes the cross-entropy. The `_dare_*` functions are short
plain-torch transcriptions of that code and of `compute_policy_loss` /
`compute_policy_loss_bgpo` (`verl/trainer/ppo/dllm_core_algos.py`); the tests feed them and our
`D1` / `BGPO` on `dllm_train.Scorer` the same float64 model, masks and advantages.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import dllm_algorithms as da
from dllm_models.attention import AttentionMask
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import LossInputs, RLBatch, Scorer, SpecialTokens
from tests.dllm_algorithms.test_parity_block import _assert_close, _dare_bgpo_pg, _dare_policy_pg, _grads
from tests.dllm_models.tiny_configs import EOS, MASK, build_tiny

ADV = torch.tensor([0.9, -0.6, 0.3], dtype=torch.float64)


def _dare_logits(model: torch.nn.Module, noisy: torch.Tensor, attn: torch.Tensor, shift: bool = True) -> torch.Tensor:
    """Packed forward, `get_packed_logits(shift_logits=True)` and the per-sample restore: [B, S, V]."""
    rows = [noisy[b][attn[b]] for b in range(noisy.shape[0])]
    lengths = [len(r) for r in rows]
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    packed = torch.cat(rows)[None]
    logits = model(packed, attention=AttentionMask(cu_seqlens=cu, max_seqlen=max(lengths))).logits
    if shift:
        logits = torch.cat([logits[:, 0:1], logits[:, :-1]], dim=1)
    out = torch.zeros(*noisy.shape, logits.shape[-1], dtype=logits.dtype)
    for b in range(noisy.shape[0]):
        out[b, attn[b]] = logits[0, cu[b]:cu[b + 1]]
    return out


def _model() -> torch.nn.Module:
    return build_tiny("Dream", seed=4, std=0.3).double()


def _batch() -> RLBatch:
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 60, (3, 5), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1] * 5, [0, 1, 1, 1, 1]], dtype=torch.bool)
    response_mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1] * 6], dtype=torch.bool)
    response = torch.where(response_mask, torch.randint(0, 60, (3, 6), generator=g), EOS)
    rollout = RolloutBatch(prompt_ids=prompt, prompt_mask=prompt_mask, response_ids=response,
                           response_mask=response_mask, seeds=torch.arange(3),
                           config=SamplingConfig(max_new_tokens=6, steps=6, block_length=6))
    return RLBatch(rollout=rollout, scores=torch.zeros(3), group_ids=torch.zeros(3, dtype=torch.long),
                   tokens=SpecialTokens(mask_id=MASK, eos_id=EOS, pad_id=EOS))


def test_dream_d1_matches_dare_shifted_logits() -> None:
    model, batch, alg = _model(), _batch(), da.D1()
    plan = alg.prepare(batch, torch.Generator().manual_seed(0))
    ids, attn = batch.rollout.input_ids, batch.rollout.attention_mask
    noisy = torch.where(plan.mask[:, 0], MASK, ids)
    resp = batch.rollout.response_mask.double()

    def dare_logp(shift: bool) -> torch.Tensor:
        ce = F.cross_entropy(_dare_logits(model, noisy, attn, shift).transpose(1, 2), ids, reduction="none")
        return -ce[:, -6:]  # `log_prob[b, i, :] = -CE(...)[-response_length:]`

    dare_lp = dare_logp(True)
    ours_v = alg.values(Scorer(model), batch, plan, 0)
    torch.testing.assert_close(ours_v.double() * resp, dare_lp * resp, rtol=1e-6, atol=1e-7)
    # the shift matters: without it the values differ
    assert float(((dare_logp(False) - dare_lp).detach() * resp).abs().max()) > 1e-2

    old = dare_lp.detach() + 0.3 * torch.randn(3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    dare_loss = _dare_policy_pg(old, dare_lp, ADV[:, None] * resp, resp)
    dare_grads = _grads(dare_loss, model)
    ours_loss, _ = alg.loss(ours_v, LossInputs(batch=batch, data=plan, iteration=0, advantages=ADV, old=old, ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)


def test_dream_bgpo_matches_dare() -> None:
    model, batch, alg = _model(), _batch(), da.BGPO(mc_num=2)
    plan = alg.prepare(batch, torch.Generator().manual_seed(2))
    ids, attn = batch.rollout.input_ids, batch.rollout.attention_mask
    resp = batch.rollout.response_mask.double()
    dare_l = []
    for i in range(2):
        mask, p = plan.mask[:, i], plan.p_mask[:, i].double()
        ce = F.cross_entropy(_dare_logits(model, torch.where(mask, MASK, ids), attn).transpose(1, 2), ids,
                             reduction="none")
        # `loss_per_sample[b, i] = -(CE[mask] / p_mask[mask]).sum()`, then / response_length
        dare_l.append(-torch.where(mask, ce / torch.where(mask, p, 1.0), 0.0).sum(-1) / 6)
    dare_v = torch.stack(dare_l, 1)
    ours_v = alg.values(Scorer(model), batch, plan, 0)
    torch.testing.assert_close(ours_v.double(), dare_v, rtol=1e-6, atol=1e-7)

    # no D exactly on the clip boundary 1 + 0.2 (there max() splits the gradient of a tie)
    old = dare_v.detach() + torch.tensor([[0.1, -0.3], [0.4, 0.02], [-0.25, 0.3]], dtype=torch.float64)
    # `loss_per_sample` is broadcast over the response; token-mean over the valid tokens; / mc_num
    dare_loss = sum(_dare_bgpo_pg(old[:, i, None] * resp, dare_v[:, i, None] * resp, ADV[:, None] * resp, resp)
                    for i in range(2)) / 2
    dare_grads = _grads(dare_loss, model)
    ours_loss, _ = alg.loss(ours_v, LossInputs(batch=batch, data=plan, iteration=0, advantages=ADV, old=old, ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)
