"""BridgeRatio-GRPO through the model: parity with DARE's actor, diagnostics in the step metrics.

The original is yjyddq/DARE PR #21 (commit 6d4791f): `llada_dp_actor_bridgeratio_grpo.py`
(`update_policy`, `_scale_bridge_path_scores`) on the path scores of
`llada_dp_actor_coupled_grpo.py` `_forward_micro_batch` (`loss_per_sample[b, i] =
-(CE[mask] / p_mask[mask]).sum()`, divided by the padded response length and broadcast over it),
and `dream_dp_actor_bridgeratio_grpo.py` (the same with Dream's shifted logits). The loss is the
transcription of `compute_policy_loss_bridgeratio` in tests/dllm_objectives/test_parity_bridge_ratio.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import dllm_algorithms as da
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import LossInputs, RLBatch, Scorer, SpecialTokens
from tests.dllm_algorithms.test_parity_block import _assert_close, _grads
from tests.dllm_algorithms.test_parity_dream import _dare_logits
from tests.dllm_models.tiny_configs import EOS, MASK, VOCAB, build_tiny
from tests.dllm_objectives.test_parity_bridge_ratio import _dare_loss
from tests.tiny_rl import local_rl, text_reward, tiny_model

ADV = torch.tensor([1.1, -0.7, 0.4], dtype=torch.float64)
R = 6


def _model(family: str) -> torch.nn.Module:
    """A float64 tiny model with the special ids of tests.dllm_models.tiny_configs (vocab 64)."""
    extra = {"vocab_size": VOCAB, "embedding_size": VOCAB, "mask_token_id": MASK, "eos_token_id": EOS,
             "pad_token_id": EOS} if family == "llada" else {}
    return build_tiny(family, seed=5, std=0.3, **extra).double()


def _batch() -> RLBatch:
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, 60, (3, 5), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1] * 5, [0, 1, 1, 1, 1]], dtype=torch.bool)
    response_mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1] * 6], dtype=torch.bool)
    response = torch.where(response_mask, torch.randint(0, 60, (3, R), generator=g), EOS)
    rollout = RolloutBatch(prompt_ids=prompt, prompt_mask=prompt_mask, response_ids=response,
                           response_mask=response_mask, seeds=torch.arange(3),
                           config=SamplingConfig(max_new_tokens=R, steps=R, block_length=R))
    return RLBatch(rollout=rollout, scores=torch.zeros(3), group_ids=torch.zeros(3, dtype=torch.long),
                   tokens=SpecialTokens(mask_id=MASK, eos_id=EOS, pad_id=EOS))


def _dare_path_scores(model: torch.nn.Module, batch: RLBatch, mask: torch.Tensor, p_mask: torch.Tensor,
                      shift: bool, scale: str) -> torch.Tensor:
    """[B, 3] DARE path scores on the given copies (`_forward_micro_batch` + `_scale_bridge_path_scores`)."""
    ids, attn = batch.rollout.input_ids, batch.rollout.attention_mask
    out = []
    for i in range(mask.shape[1]):
        m = mask[:, i]
        logits = _dare_logits(model, torch.where(m, MASK, ids), attn, shift)
        ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")
        p = torch.where(m, p_mask[:, i].double(), 1.0)
        out.append(-torch.where(m, ce / p, 0.0).sum(-1) / R)
    scores = torch.stack(out, 1)
    if scale == "sequence":
        return scores * R
    if scale == "valid_tokens":
        return scores * batch.rollout.response_mask.sum(-1, keepdim=True).clamp(min=1)
    return scores


@pytest.mark.parametrize(("family", "scale", "correction"), [
    ("llada", "token", "none"), ("Dream", "token", "none"), ("llada", "sequence", "delta"),
    ("Dream", "valid_tokens", "jackknife"), ("llada", "token", "cumulant"),
])
def test_bridge_ratio_grpo_matches_dare(family: str, scale: str, correction: str) -> None:
    model = _model(family)
    batch = _batch()
    alg = da.BridgeRatioGRPO(score_scale=scale, correction=correction)
    plan = alg.prepare(batch, torch.Generator().manual_seed(3))
    dare_v = _dare_path_scores(model, batch, plan.mask, plan.p_mask, family == "Dream", scale)
    ours_v = alg.values(Scorer(model), batch, plan, 0)
    torch.testing.assert_close(ours_v.double(), dare_v, rtol=1e-6, atol=1e-6)

    old = dare_v.detach() + 0.15 * torch.randn(3, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    resp = batch.rollout.response_mask.double()
    dare_loss = _dare_loss(old, dare_v, ADV[:, None] * resp, resp, correction=correction)[0]
    dare_grads = _grads(dare_loss, model)
    ours_loss, metrics = alg.loss(ours_v, LossInputs(batch=batch, data=plan, iteration=0, advantages=ADV, old=old,
                                                     ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)
    assert metrics["bridge_num_paths"].item() == 3


def test_dare_masks_padding_as_response_positions() -> None:
    # DARE's `_forward_process_coupled_grpo` (dllm_core_algos.py, 6d4791f) masks `~prompt_index`:
    # the prompt's left padding and the response padding too, which the actor scores with zero
    # logits (CE = log V, constant in theta). Ours masks valid response positions only, so the
    # full-mask path differs by exactly -(padding count) log V / R (docs/algorithms.md#bridgeratio-grpo).
    model = _model("llada")
    batch = _batch()
    alg = da.BridgeRatioGRPO()
    plan = alg.prepare(batch, torch.Generator().manual_seed(3))
    attn = batch.rollout.attention_mask
    prompt_index = attn.clone()
    prompt_index[:, 5:] = False
    dare_full = ~prompt_index  # copy 0 of DARE's plan
    ids = batch.rollout.input_ids
    logits = _dare_logits(model, torch.where(dare_full, MASK, ids), attn, shift=False)
    ce = F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")  # zero logits on padding: log V
    dare_path0 = -torch.where(dare_full, ce, 0.0).sum(-1) / R
    ours_path0 = alg.values(Scorer(model), batch, plan, 0)[:, 0].double()
    pads = (~attn).sum(-1).double()
    torch.testing.assert_close(dare_path0 - ours_path0, -pads * math.log(VOCAB) / R, rtol=1e-6, atol=1e-6)
    assert float(pads.sum()) > 0


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_step_logs_the_bridge_diagnostics(family: str) -> None:
    model = tiny_model(family)
    rl = local_rl(model, da.BridgeRatioGRPO(correction="delta"), max_tokens_per_pass=32, reward=text_reward)
    metrics = rl.step(0)
    for key in ("bridge_log_ratio", "bridge_ratio_mean", "bridge_ratio_max", "bridge_correction", "clip_frac",
                "ppo_kl", "dual_clip_frac"):
        assert key in metrics and math.isfinite(float(metrics[key])), key
    assert metrics["bridge_num_paths"] == 3


def test_bad_fields_name_the_field_and_the_choices() -> None:
    with pytest.raises(ValueError, match="algorithm.correction.*jackknife"):
        da.BridgeRatioGRPO(correction="bias")
    with pytest.raises(ValueError, match="algorithm.score_scale.*valid_tokens"):
        da.BridgeRatioGRPO(score_scale="seq")
    with pytest.raises(ValueError, match="algorithm.log_ratio_clip"):
        da.BridgeRatioGRPO(log_ratio_clip=-1.0)
    with pytest.raises(ValueError, match="algorithm.t_min"):
        da.BridgeRatioGRPO(t_min=0.9, t_max=0.2)
