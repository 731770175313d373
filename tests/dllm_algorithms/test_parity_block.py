"""Parity of the block-diffusion families (SDAR, LLaDA2) with DARE's loss code.

Each `_dare_*` function below is a short plain-torch transcription of yjyddq/DARE at commit
83ae8a3 (file and function named in its docstring); the tests feed it and our algorithms
(`dllm_algorithms.BGPO`, `EBPO`, `CJGRPO` on `dllm_train.Scorer`) the same model, masks and
advantages and compare values, losses and gradients, in float64 weights.

What DARE does for block models (docs/algorithms.md#block-diffusion):
- compaction (`block_diffusion_utils.compact_block_diffusion_artifacts`): prompt and response
  padding removed per sample, targets = masked *response* positions;
- the `[noisy ; clean]` layout (`build_full_block_diffusion_tensors`) with the same position ids in
  both halves and the BD3LM mask (`build_block_diffusion_mask`, block ids from the compact
  position on the global grid);
- token loss CE / p_mask on the noisy half (the SDAR/LLaDA2 model's `block_diffusion_token_loss`);
- BGPO (`sdar_dp_actor_bgpo.py`, `llada2_dp_actor_bgpo.py`): per MC sample
  l_i = -sum(token loss) / valid response length, broadcast over valid tokens, then
  `compute_policy_loss_bgpo` (token-mean), divided by mc_num and summed over samples;
- EBPO (`ebpo_actor_mixin.py`, `sdar_dp_actor_ebpo.py`): token ELBOs scattered to the response,
  composite = mean over rows of the sum over tokens, `compute_policy_loss_ebpo` (log-domain clip,
  mean over valid samples);
- CJ-GRPO (`cj_grpo_sglang_mixin.py`): paper-exact weights (`compute_cj_block_step_token_weights`),
  per local step `compute_policy_loss` with the weights as the mask, times (mass + 1e-8) / B.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import dllm_algorithms as da
import dllm_objectives as do
from dllm_models.attention import AttentionMask
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import LossInputs, RLBatch, Scorer, SpecialTokens
from tests.dllm_models.tiny_configs import EOS, MASK, build_tiny

BLOCK = 4
FAMILIES = ("sdar", "llada2_moe")


# ---------------------------------------------------------------- DARE transcriptions (83ae8a3)

def _dare_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl/utils/torch_functional.py `masked_mean` (agg_loss 'token-mean')."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _dare_compact(noisy: torch.Tensor, clean: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                  target: torch.Tensor, p_mask: torch.Tensor, prompt_section_length: int) -> dict[str, torch.Tensor]:
    """verl/workers/actor/block_diffusion_utils.py `compact_block_diffusion_artifacts`."""
    valid = attn.bool()
    lengths = valid.sum(1)
    n = int(lengths.max())
    b = clean.shape[0]
    out = {"noisy": torch.full((b, n), EOS), "clean": torch.full((b, n), EOS),
           "valid": torch.zeros((b, n), dtype=torch.bool), "target": torch.zeros((b, n), dtype=torch.bool),
           "p_mask": torch.zeros((b, n), dtype=p_mask.dtype), "pos": torch.zeros((b, n), dtype=torch.long),
           "response_positions": torch.full((b, n), -1)}
    for i in range(b):
        idx = torch.nonzero(valid[i]).flatten()
        m = int(lengths[i])
        out["noisy"][i, :m] = noisy[i, idx]
        out["clean"][i, :m] = clean[i, idx]
        out["valid"][i, :m] = True
        out["pos"][i, :m] = pos[i, idx]
        is_response = idx >= prompt_section_length
        out["target"][i, :m] = target[i, idx].bool() & is_response
        out["p_mask"][i, :m] = p_mask[i, idx]
        out["response_positions"][i, :m] = torch.where(is_response, idx - prompt_section_length, -1)
    return out


def _dare_block_ids(valid: torch.Tensor) -> torch.Tensor:
    """block_diffusion_utils.py `build_token_block_ids`, block_origin='global'."""
    idx = torch.arange(valid.shape[1]).expand_as(valid)
    return torch.where(valid, torch.div(idx, BLOCK, rounding_mode="floor"), -1)


def _dare_mask(block_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """block_diffusion_utils.py `build_block_diffusion_mask`: its `mask_mod` on every (q, kv)."""
    n = block_ids.shape[1]
    q = torch.arange(2 * n)[:, None]
    kv = torch.arange(2 * n)[None, :]
    q_clean, k_clean = q >= n, kv >= n
    qb, kb = block_ids[:, q % n], block_ids[:, kv % n]
    qv, kvv = valid[:, q % n], valid[:, kv % n]
    diag = (qb == kb) & (q_clean == k_clean)
    offset_causal = (qb > kb) & k_clean & ~q_clean
    causal = (qb >= kb) & k_clean & q_clean
    return qv & kvv & (diag | offset_causal | causal)


def _dare_token_losses(model: torch.nn.Module, art: dict[str, torch.Tensor]) -> torch.Tensor:
    """`_compute_block_diffusion_token_losses` (sdar/llada2 BGPO actors): CE / p on the noisy half."""
    n = art["clean"].shape[1]
    ids = _dare_block_ids(art["valid"])
    full_ids = torch.cat([art["noisy"], art["clean"]], 1)
    full_pos = torch.cat([art["pos"], art["pos"]], 1)
    # The model runs the BD3LM rule of dllm_models; check it is DARE's mask_mod on this layout.
    mask = AttentionMask(key_padding=torch.cat([art["valid"]] * 2, 1), block_ids=torch.cat([ids, ids], 1),
                         is_clean=torch.cat([torch.zeros_like(art["valid"]), torch.ones_like(art["valid"])], 1))
    dense = mask.dense(2 * n, 2 * n, full_ids.device)
    assert dense is not None
    dare = _dare_mask(ids, art["valid"])
    real = torch.cat([art["valid"]] * 2, 1)[:, :, None]  # DARE also hides padding queries; ours lets them look
    assert bool((dense[:, 0] & real == dare).all())
    logits = model(full_ids, position_ids=full_pos, attention=mask).logits[:, :n]
    ce = F.cross_entropy(logits.transpose(1, 2), art["clean"], reduction="none")
    p = torch.where(art["target"], art["p_mask"], torch.ones_like(art["p_mask"]))
    return torch.where(art["target"], ce / p, torch.zeros_like(ce))


def _dare_scatter(values: torch.Tensor, art: dict[str, torch.Tensor], response_length: int) -> torch.Tensor:
    """block_diffusion_utils.py `scatter_compact_values_to_response`."""
    out = values.sum() * 0 + torch.zeros(values.shape[0], response_length, dtype=values.dtype)
    out = out.clone()
    for i in range(values.shape[0]):
        sel = art["target"][i]
        out[i, art["response_positions"][i, sel]] = values[i, sel]
    return out


def _dare_bgpo_pg(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  clip: float = 0.2, clip_c: float = 3.0) -> torch.Tensor:
    """verl/trainer/ppo/dllm_core_algos.py `compute_policy_loss_bgpo` (token-mean)."""
    neg_kl = torch.where(adv > 0, torch.log(1 + new - old), new - old)
    ratio = torch.exp(neg_kl)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    c1 = torch.maximum(pg1, pg2)
    c2 = torch.min(-adv * clip_c, c1)
    return _dare_masked_mean(torch.where(adv < 0, c2, c1), mask)


def _dare_policy_pg(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                    clip: float = 0.2, clip_c: float = 3.0) -> torch.Tensor:
    """dllm_core_algos.py `compute_policy_loss` (token-mean, dual clip)."""
    ratio = torch.exp(new - old)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - clip, 1 + clip)
    c1 = torch.maximum(pg1, pg2)
    c2 = torch.min(-adv * clip_c, c1)
    return _dare_masked_mean(torch.where(adv < 0, c2, c1), mask)


def _dare_ebpo_pg(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor,
                  clip: float = 0.2) -> torch.Tensor:
    """dllm_core_algos.py `compute_policy_loss_ebpo` (log-domain clip, mean over valid samples)."""
    log_ratio = new[valid] - old[valid]
    a = adv[valid]
    eff = torch.where(a >= 0, torch.minimum(log_ratio, torch.log1p(log_ratio.new_tensor(clip))),
                      torch.maximum(log_ratio, torch.log1p(log_ratio.new_tensor(-clip))))
    return (-a * torch.exp(eff)).mean()


def _dare_cj_weights(traj: torch.Tensor, response_mask: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """block_diffusion_utils.py `compute_cj_block_step_token_weights` (global origin), as loops."""
    b, k, r = traj.shape[0], traj.shape[1], response_mask.shape[1]
    ids = torch.where(attn, torch.div((attn.long().cumsum(1) - 1).clamp_min(0), BLOCK, rounding_mode="floor"), -1)
    rid = ids[:, -r:]
    sel = traj[:, :, -r:] & response_mask[:, None, :]
    w = torch.zeros(b, k, r)
    for i in range(b):
        trans = {(s, int(rid[i, j])) for s in range(k) for j in range(r) if sel[i, s, j]}
        for s, blk in trans:
            cell = sel[i, s] & (rid[i] == blk)
            w[i, s, cell] = 1.0 / int(cell.sum()) / len(trans)
    return w


# ---------------------------------------------------------------- shared inputs

def _model(family: str) -> torch.nn.Module:
    return build_tiny(family, seed=3, std=0.3).double()


def _rollout(empty_row: bool = False, **extra: torch.Tensor) -> RolloutBatch:
    """Three samples: left-padded prompts, right-padded (varying L) responses, P = 6, R = 7
    (`empty_row`: the second response has no valid token, e.g. EOS first under eos_handling='truncate')."""
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 60, (3, 6), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    response = torch.randint(0, 60, (3, 7), generator=g)
    response_mask = torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    if empty_row:
        response_mask[1] = False
    response = torch.where(response_mask, response, EOS)
    cfg = SamplingConfig(max_new_tokens=7, steps=4, block_length=BLOCK, block_diffusion=True)
    return RolloutBatch(prompt_ids=prompt, prompt_mask=prompt_mask, response_ids=response,
                        response_mask=response_mask, seeds=torch.arange(3), config=cfg, **extra)


def _batch(rollout: RolloutBatch) -> RLBatch:
    return RLBatch(rollout=rollout, scores=torch.zeros(3), group_ids=torch.zeros(3, dtype=torch.long),
                   tokens=SpecialTokens(mask_id=MASK, eos_id=EOS, pad_id=EOS))


ADV = torch.tensor([0.7, -1.3, 0.4], dtype=torch.float64)


def _grads(loss: torch.Tensor, model: torch.nn.Module) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [g if g is not None else torch.zeros_like(p)
            for g, p in zip(torch.autograd.grad(loss, params, allow_unused=True), params)]


def _assert_close(a: torch.Tensor, b: torch.Tensor, ga: list[torch.Tensor], gb: list[torch.Tensor]) -> None:
    # The model runs in float64, so both sides get the same token log-probs; our objectives then
    # compute in float32 by design (docs/algorithms.md#numerics; DARE's token losses are `.float()`
    # too), so the tolerance is float32 rounding of raw ELBOs of a few hundred nats.
    assert a.item() == pytest.approx(b.item(), rel=2e-5, abs=1e-8)
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(ga, gb)) ** 0.5
    den = sum(float(y.pow(2).sum()) for y in gb) ** 0.5
    assert den > 0 and num <= 2e-5 * den, (num, den)


def _dare_values(model: torch.nn.Module, rollout: RolloutBatch,
                 plan: do.MaskPlan) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """Per MC row: DARE's compact token losses [B, n] and artifacts (one forward each)."""
    ids, attn = rollout.input_ids, rollout.attention_mask
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    out = []
    for i in range(plan.num_samples):
        noisy = torch.where(plan.mask[:, i], MASK, ids)
        art = _dare_compact(noisy, ids, attn, pos, plan.mask[:, i], plan.p_mask[:, i].double(),
                            rollout.prompt_ids.shape[1])
        out.append((_dare_token_losses(model, art), art))
    return out


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize("family", FAMILIES)
def test_bgpo_block_matches_dare(family: str) -> None:
    model, rollout = _model(family), _rollout()
    batch, alg = _batch(rollout), da.BGPO(mc_num=3)
    plan = alg.prepare(batch, torch.Generator().manual_seed(0))
    resp = rollout.response_mask.double()
    valid_len = resp.sum(-1)
    # old values off the current ones, so the ratio, the clip and the dual clip all act
    shift = torch.tensor([[0.05, -0.4, 0.3], [-0.3, 0.02, 0.5], [0.4, -0.1, -0.02]], dtype=torch.float64)

    parts = _dare_values(model, rollout, plan)
    dare_l = torch.stack([-(tl.sum(-1)) / valid_len for tl, _ in parts], 1)  # [B, N]
    old = dare_l.detach() + shift
    dare_loss = sum(_dare_bgpo_pg(old[:, i, None] * resp, dare_l[:, i, None] * resp, ADV[:, None] * resp, resp)
                    for i in range(3)) / 3
    dare_grads = _grads(dare_loss, model)

    ours_v = alg.values(Scorer(model), batch, plan, 0)
    torch.testing.assert_close(ours_v.double(), dare_l, rtol=1e-6, atol=1e-7)
    ours_loss, _ = alg.loss(ours_v, LossInputs(batch=batch, data=plan, iteration=0, advantages=ADV, old=old, ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)


@pytest.mark.parametrize(("family", "empty_row"), [("sdar", False), ("llada2_moe", False), ("sdar", True)])
def test_ebpo_block_matches_dare(family: str, empty_row: bool) -> None:
    # DARE averages the loss over the sequences with a valid response token (`sample_mask`)
    model, rollout = _model(family), _rollout(empty_row)
    batch, alg = _batch(rollout), da.EBPO(mc_num=2)
    plan = alg.prepare(batch, torch.Generator().manual_seed(1))
    r = rollout.response_ids.shape[1]
    parts = _dare_values(model, rollout, plan)
    token_elbos = torch.stack([_dare_scatter(-tl, art, r) for tl, art in parts], 1)  # [B, N, R]
    dare_e = torch.where(rollout.response_mask[:, None, :], token_elbos, 0.0).sum(-1).mean(1)  # [B]
    old = dare_e.detach() + torch.tensor([0.05, -0.5, 0.3], dtype=torch.float64)
    dare_loss = _dare_ebpo_pg(old, dare_e, ADV, rollout.response_mask.any(-1))
    dare_grads = _grads(dare_loss, model)

    ours_v = alg.values(Scorer(model), batch, plan, 0)
    torch.testing.assert_close(ours_v.double(), dare_e, rtol=1e-6, atol=1e-6)
    ours_loss, _ = alg.loss(ours_v, LossInputs(batch=batch, data=plan, iteration=0, advantages=ADV, old=old, ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)


def _aligned_cj_rollout() -> tuple[RolloutBatch, torch.Tensor, torch.Tensor]:
    """An aligned CJ rollout with post-EOS tokens in terminal blocks, and DARE's view of it.

    Prompts of 4, 6 and 5 real tokens (P = 6), R = 7, block 4 on the global grid. Budgets aligned
    to the grid (`align_cj_max_new_tokens`): 7 - (4 + 7) % 4 = 4, 7 - 13 % 4 = 6, 7 - 12 % 4 = 7.
    Row 0 stops at response column 1 (EOS) inside block 1 (columns 0-3): SGLang's replay payload
    is columns 0-3. Row 1 stops at column 0, in block 1 (columns 0-1): replay 0-1. Row 2 runs to its
    budget, which ends on the grid: replay = the visible response.

    Returns:
        (our rollout, DARE's replay response mask [B, R], DARE's block-local steps [B, R], -1 off replay)
    """
    unmask = torch.tensor([[0, 1, 0, 1, 2, 3, 2],  # blocks: cols 0-3 | 4-6
                           [0, 1, 2, 2, 3, 3, 4],  # cols 0-1 | 2-5 | 6
                           [0, 0, 1, 2, 3, 4, 4]])  # cols 0-2 | 3-6
    counted = torch.tensor([[1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0], [1] * 7], dtype=torch.bool)
    rollout = _rollout(unmask_step=unmask)
    response = rollout.response_ids.clone()
    response[0, 1], response[1, 0] = EOS, EOS
    response = torch.where(response == EOS, torch.where(counted, EOS, 7), response)  # EOS only where it stops
    cfg = SamplingConfig(max_new_tokens=7, steps=4, block_length=BLOCK, block_diffusion=True,
                         block_aligned_budget=True)
    rollout = RolloutBatch(prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask, response_ids=response,
                           response_mask=counted, seeds=rollout.seeds, config=cfg, unmask_step=unmask)
    replay = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0], [1] * 7], dtype=torch.bool)
    # SGLang's 1-based block-local step maps minus 1 (cj_trajectory.py:350), -1 off the replay payload
    local = torch.tensor([[0, 1, 0, 1, -1, -1, -1], [0, 1, -1, -1, -1, -1, -1], [0, 0, 1, 0, 1, 2, 2]])
    return rollout, replay, local


def _dare_cj_trajectory(local: torch.Tensor, replay: torch.Tensor, prompt_length: int, k: int) -> torch.Tensor:
    """cj_trajectory.py `build_block_parallel_cj_trajectory` (lines 559-631): [B, K, P + R] indicators."""
    b, r = local.shape
    out = torch.zeros(b, k, r, dtype=torch.bool)
    bi, ri = torch.nonzero(replay, as_tuple=True)
    out[bi, local[bi, ri], ri] = True
    return torch.cat([torch.zeros(b, k, prompt_length, dtype=torch.bool), out], -1)


def _dare_cj_step_logp(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor, traj: torch.Tensor,
                       step: int, r: int) -> torch.Tensor:
    """cj_grpo_sglang_mixin.py `_step_forward_micro_batch` (130-171) with block_diffusion_utils.py
    `build_block_parallel_cj_step_inputs` (242-301): [B, R] log-probs of the step's targets."""
    p = ids.shape[1] - r
    initial = torch.full_like(ids, MASK)
    initial[:, :p] = ids[:, :p]
    noisy = initial if step == 0 else torch.where(traj[:, :step].any(1), ids, initial)
    target = traj[:, step] & attn
    target[:, :p] = False
    pos = (attn.long().cumsum(-1) - 1).clamp(min=0)
    art = _dare_compact(noisy, ids, attn, pos, target, torch.ones(ids.shape, dtype=torch.float64), p)
    return _dare_scatter(-_dare_token_losses(model, art), art, r)


@pytest.mark.parametrize("family", FAMILIES)
def test_cj_grpo_block_replays_terminal_block_as_dare(family: str) -> None:
    """DARE 5f8e5f0: the tokens after EOS in the terminal block are context and latent actions."""
    model = _model(family)
    rollout, replay, local = _aligned_cj_rollout()
    batch, alg = _batch(rollout), da.CJGRPO()
    data = alg.prepare(batch, torch.Generator().manual_seed(0))
    p, r, k = 6, 7, 3
    assert data.plan.mask.shape[1] == k
    assert torch.equal(data.attention[:, p:], replay)
    assert not torch.equal(replay, rollout.response_mask)  # the replay adds post-EOS tokens

    # DARE: build_cj_replay_model_inputs (block_diffusion_utils.py:73-178): prompt + replay tokens,
    # attention = prompt mask + replay mask; advantages expanded to the replay (193-230)
    ids = rollout.input_ids
    attn = torch.cat([rollout.prompt_mask, replay], 1)
    traj = _dare_cj_trajectory(local, replay, p, k)
    dare_w = _dare_cj_weights(traj, replay, attn)
    torch.testing.assert_close(data.weights[:, :, p:] * 3, dare_w)
    dare_lp = torch.stack([_dare_cj_step_logp(model, ids, attn, traj, s, r) for s in range(k)], 1)  # [B, K, R]
    g = torch.Generator().manual_seed(2)
    old = dare_lp.detach() + 0.3 * torch.randn(3, k, r, generator=g, dtype=torch.float64)
    adv = ADV[:, None] * replay.double()
    # cj_grpo_sglang_mixin.py:497-560: per local step compute_policy_loss with the weights as the
    # mask, times (step mass + 1e-8) / B, summed over steps
    dare_loss = sum(_dare_policy_pg(old[:, s], dare_lp[:, s], adv, dare_w[:, s].double())
                    * (dare_w[:, s].sum().double() + 1e-8) / 3 for s in range(k))
    dare_grads = _grads(dare_loss, model)

    ours_v = alg.values(Scorer(model), batch, data, 0)
    w = dare_w > 0
    torch.testing.assert_close(ours_v[:, :, p:].double()[w], dare_lp[w], rtol=1e-6, atol=1e-7)
    ours_old = torch.cat([torch.zeros(3, k, p, dtype=torch.float64), old], -1)
    ours_loss, _ = alg.loss(ours_v, LossInputs(batch=batch, data=data, iteration=0, advantages=ADV, old=ours_old,
                                               ref=None))
    _assert_close(ours_loss, dare_loss, _grads(ours_loss, model), dare_grads)


def test_cj_grpo_block_replays_a_cut_terminal_block_up_to_the_response_end() -> None:
    # without aligned budgets (not DARE's protocol): a prompt of 4 tokens, R = 7, block 4, no stop:
    # the last block (columns 4-7) is cut by the length budget and replayed up to column 6
    rollout = _rollout(unmask_step=torch.zeros(3, 7, dtype=torch.long))
    data = da.CJGRPO().prepare(_batch(rollout), torch.Generator().manual_seed(0))
    # row 0 (P 4, 7 counted): block 2 ends at column 8, cut to 7; row 1 (P 6, 4 counted): columns
    # 2-5 form its terminal block; row 2 (P 5, 6 counted): its block ends at column 7
    want = torch.tensor([[1] * 7, [1, 1, 1, 1, 1, 1, 0], [1] * 7], dtype=torch.bool)
    assert torch.equal(data.attention[:, 6:], want)


def test_cj_grpo_block_replay_ignores_blocks_filled_after_the_stop() -> None:
    # eos_handling="keep" with stop_at_eos: every column counts, but a row that stopped left its later
    # blocks filled and never decoded (unmask step -1); they are no actions, so the replay is the one
    # of the row counted through its stop (before: "a position of a terminal block has no recorded
    # unmask step", found by benchmarks/algorithm_comparison.py --family sdar --algorithms cj-grpo)
    rollout, replay, _ = _aligned_cj_rollout()
    unmask = rollout.unmask_step.clone()
    unmask[0, 4:] = -1  # row 0 stopped in block 1 (columns 0-3): columns 4-6 were filled
    unmask[1, 2:] = -1  # row 1 stopped in block 1 (columns 0-1)
    kept = RolloutBatch(prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask,
                        response_ids=rollout.response_ids, response_mask=torch.ones_like(rollout.response_mask),
                        seeds=rollout.seeds, config=rollout.config, unmask_step=unmask)
    data = da.CJGRPO().prepare(_batch(kept), torch.Generator().manual_seed(0))
    assert torch.equal(data.attention[:, 6:], replay)
    with pytest.raises(ValueError, match="has no recorded unmask step"):  # a hole inside a decoded block
        holed = unmask.clone()
        holed[2, 4] = -1  # row 2's block 2 holds columns 3-6
        da.CJGRPO().prepare(_batch(dataclasses.replace(kept, unmask_step=holed)), torch.Generator().manual_seed(0))
