"""Coupled-GRPO (the paths BridgeRatio-GRPO shares) through the model: parity with DARE's actor.

Transcribed from yjyddq/DARE at commit 83ae8a3, `verl/workers/actor/llada_dp_actor_coupled_grpo.py`
`_forward_micro_batch`: `log_prob_T[mask_0] = -CE`, `log_prob_t[mask_1] = -CE / p_mask`,
`log_prob_t_couple[mask_2] = -CE / p_mask`, `log_prob = (log_prob_T + log_prob_t + log_prob_t_couple) / 2`,
then `compute_policy_loss` (token-mean, dual clip); Dream's actor reads shifted logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dllm_algorithms as da
from dllm_train import LossInputs, Scorer
from tests.dllm_algorithms.test_parity_block import _assert_close, _dare_policy_pg, _grads
from tests.dllm_algorithms.test_parity_bridge_ratio import R, _batch, _model
from tests.dllm_algorithms.test_parity_dream import _dare_logits
from tests.dllm_models.tiny_configs import MASK

ADV = torch.tensor([0.8, -1.2, 0.5], dtype=torch.float64)


@pytest.mark.parametrize("family", ["llada", "Dream"])
def test_coupled_grpo_matches_dare(family: str) -> None:
    model, batch, alg = _model(family), _batch(), da.CoupledGRPO()
    plan = alg.prepare(batch, torch.Generator().manual_seed(7))
    ids, attn = batch.rollout.input_ids, batch.rollout.attention_mask
    parts = []
    for i in range(3):
        m = plan.mask[:, i]
        ce = F.cross_entropy(_dare_logits(model, torch.where(m, MASK, ids), attn, family == "Dream").transpose(1, 2),
                             ids, reduction="none")
        p = torch.where(m, plan.p_mask[:, i].double(), 1.0)
        parts.append(torch.where(m, -ce / p, 0.0))
    dare_lp = ((parts[0] + parts[1] + parts[2]) / 2)[:, -R:]
    resp = batch.rollout.response_mask.double()
    ours_v = alg.values(Scorer(model), batch, plan, 0)
    torch.testing.assert_close(ours_v.double() * resp, dare_lp * resp, rtol=1e-6, atol=1e-6)

    old = dare_lp.detach() + 0.3 * torch.randn(3, R, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    dare_loss = _dare_policy_pg(old, dare_lp, ADV[:, None] * resp, resp)
    dare_grads = _grads(dare_loss, model)
    ours_loss, _ = alg.loss(ours_v, LossInputs(batch=batch, data=plan, iteration=0, advantages=ADV, old=old, ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)
