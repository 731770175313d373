"""MDPO's update protocol as DARE runs it: the K selected denoising steps packed step-major, one
mini-batch (and one optimizer step) per step, all against old values computed once before the
first step. Checked against a transcription of DARE's mini-batch loop (yjyddq/DARE at 83ae8a3,
verl/workers/actor/llada_dp_actor_mdpo.py:237-304 and verl/trainer/ppo/mdpo_algos.py:26-90)."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import dllm_algorithms as da
from dllm_rollout import SamplingConfig
from dllm_train import LossInputs, sample_seeds
from tests.tiny_rl import addition_prompts, local_rl, text_reward, tiny_model

K = 16
SAMPLING = SamplingConfig(max_new_tokens=K, steps=K, block_length=K, temperature=1.0)
LR = 5e-2  # large enough that the later mini-batches move outside the clip range


@dataclass(frozen=True, kw_only=True)
class RecordingMDPO(da.MDPO):
    records: list[dict[str, Any]] = field(default_factory=list)

    def loss(self, values: torch.Tensor, inputs: LossInputs[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = super().loss(values, inputs)
        if not torch.is_grad_enabled():  # the trainer's evaluation of the mini-batch's loss
            assert inputs.old is not None
            self.records.append({"ratio": torch.exp(values - inputs.old)[inputs.data.active],
                                 "loss": float(out[0]), "clip_frac": float(out[1]["clip_frac"])})
        return out


def _prepared(alg: da.MDPO, model: Any) -> tuple[Any, Any, torch.Tensor]:
    rl = local_rl(model, alg, sampling=SAMPLING, reward=text_reward, lr=LR, grad_clip=1.0)
    prompts, answers, groups = addition_prompts(2, 4, 0)(0).expanded()
    rl.rank.rollout_step(0, prompts, answers, sample_seeds(0, len(prompts), "rollout", 0), groups)
    assert rl.rank.prepared is not None
    return rl, rl.rank.prepared, torch.zeros(len(prompts))


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    model = tiny_model("llada")
    alg = RecordingMDPO()
    rl, prepared, advantages = _prepared(alg, model)
    start = copy.deepcopy(model)
    metrics = rl.actor.update(prepared, advantages)
    return {"alg": alg, "metrics": metrics, "prepared": prepared, "start": start, "actor": rl.actor}


def test_one_optimizer_step_per_selected_denoising_step(run: dict[str, Any]) -> None:
    prepared = run["prepared"]
    b = prepared.batch.rollout.batch_size
    assert prepared.data.noisy.shape[0] == K * b  # K steps of every sample
    assert run["metrics"]["optimizer_steps"] == K
    assert run["actor"].updates == K
    assert len(run["alg"].records) == K


def test_rows_are_step_major(run: dict[str, Any]) -> None:
    prepared = run["prepared"]
    r, b = prepared.batch.rollout, prepared.batch.rollout.batch_size
    p = r.prompt_ids.shape[1]
    # every sample is decoded in K steps of one token each, so the K selected steps are all of them
    for j in range(K):
        rows = slice(j * b, (j + 1) * b)
        assert torch.equal(prepared.data.noisy[rows, p:], r.step_canvas[:, j])
        assert torch.equal(prepared.data.clean[rows, p:], r.step_x0[:, j])


def test_first_mini_batch_on_policy_later_ones_off_policy_and_clipped(run: dict[str, Any]) -> None:
    records = run["alg"].records
    first = records[0]["ratio"]
    assert first.numel() > 0 and float((first - 1).abs().max()) < 1e-6, first
    assert records[0]["clip_frac"] == 0.0
    later = torch.cat([r["ratio"] for r in records[1:]])
    assert float((later - 1).abs().max()) > 1e-3
    assert max(r["clip_frac"] for r in records[1:]) > 0.0


def test_one_step_on_all_rows_when_asked() -> None:
    model = tiny_model("llada")
    alg = RecordingMDPO(step_mini_batches=False)
    rl, prepared, advantages = _prepared(alg, model)
    metrics = rl.actor.update(prepared, advantages)
    assert metrics["optimizer_steps"] == 1 and len(alg.records) == 1


# --- DARE's loop, transcribed (one micro-batch per mini-batch: ppo_micro_batch_size = mini-batch) ---


def _dare_forward(model: Any, input_ids: torch.Tensor, target_ids: torch.Tensor, attention_mask: torch.Tensor,
                  response_length: int) -> torch.Tensor:
    """_forward_micro_batch_mdpo: log-probs of the targets on the completion region; DARE packs the
    valid tokens of each row, so each row sees its own tokens at positions 0.. (here: position ids)."""
    pos = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids, attention_mask=attention_mask, position_ids=pos).logits
    completion_logits = logits[:, -response_length:].float()
    log_probs = torch.log_softmax(completion_logits, dim=-1)
    return log_probs.gather(-1, target_ids[:, -response_length:].unsqueeze(-1)).squeeze(-1)


def _compute_mdpo_policy_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor,
                              advantages: torch.Tensor, completion_mask: torch.Tensor, confidence: torch.Tensor,
                              max_completion_length: int, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    num_valid = completion_mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    lambda_t = max_completion_length / num_valid
    ratio = torch.exp(per_token_logps - old_per_token_logps)
    clipped_ratio = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    loss1 = -advantages * ratio * lambda_t
    loss2 = -advantages * clipped_ratio * lambda_t
    per_token_loss = torch.maximum(loss1, loss2)
    pg_clipfrac = (loss2 > loss1).float()
    pg_clipfrac = (pg_clipfrac * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
    weighted_loss = per_token_loss * completion_mask * confidence
    pg_loss = weighted_loss.sum() / completion_mask.sum().clamp(min=1e-4)
    return pg_loss, pg_clipfrac


def _dare_update_policy(model: Any, data: Any, ppo_mini_batch_size: int, response_length: int,
                        epsilon: float, lr: float, grad_clip: float) -> list[tuple[float, float]]:
    """update_policy: compute_log_prob once (old), then batch.split(ppo_mini_batch_size), one
    optimizer step per mini-batch. Returns (pg_loss, pg_clipfrac) per mini-batch."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    completion_mask = data.active.float()
    model.eval()
    with torch.no_grad():
        old_per_token_logps = _dare_forward(model, data.noisy, data.clean, data.attention, response_length)
    model.train()
    out = []
    n = data.noisy.shape[0]
    for start in range(0, n, ppo_mini_batch_size):
        mb = slice(start, start + ppo_mini_batch_size)
        optimizer.zero_grad()
        per_token_logps = _dare_forward(model, data.noisy[mb], data.clean[mb], data.attention[mb], response_length)
        pg_loss, pg_clipfrac = _compute_mdpo_policy_loss(
            per_token_logps, old_per_token_logps[mb], data.advantages[mb], completion_mask[mb], data.confidence[mb],
            response_length, epsilon)
        gradient_accumulation = 1
        (pg_loss / gradient_accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        out.append((float(pg_loss.detach()), float(pg_clipfrac)))
    return out


def test_losses_equal_dare_mini_batch_loop(run: dict[str, Any]) -> None:
    prepared, model = run["prepared"], copy.deepcopy(run["start"])
    r = prepared.batch.rollout
    dare = _dare_update_policy(model, prepared.data, r.batch_size, r.response_ids.shape[1], epsilon=0.2, lr=LR,
                               grad_clip=1.0)
    ours = [(rec["loss"], rec["clip_frac"]) for rec in run["alg"].records]
    assert len(dare) == len(ours) == K
    for j, ((dl, dc), (ol, oc)) in enumerate(zip(dare, ours)):
        assert ol == pytest.approx(dl, rel=1e-4, abs=1e-6), (j, dare, ours)
        assert oc == pytest.approx(dc, abs=1e-6), (j, dc, oc)
    assert any(c > 0 for _, c in dare[1:])  # the comparison covers clipped mini-batches


# --- the training rows' positions and attention (DARE: verl/trainer/ppo/dllm_ray_trainer.py:734-765) ---


def test_rows_train_every_masked_position_of_the_response() -> None:
    """DARE's completion mask is every masked position of the step input (dllm_ray_trainer.py:757-758),
    not only the block being decoded; our step records predict the whole response
    (tests/dllm_rollout/test_prediction.py), so a row at step 0 of two blocks is active in both."""
    model = tiny_model("llada")
    sampling = SamplingConfig(max_new_tokens=K, steps=K, block_length=K // 2, temperature=1.0)
    rl = local_rl(model, da.MDPO(), sampling=sampling, reward=text_reward, lr=LR, grad_clip=1.0)
    prompts, answers, groups = addition_prompts(2, 4, 0)(0).expanded()
    rl.rank.rollout_step(0, prompts, answers, sample_seeds(0, len(prompts), "rollout", 0), groups)
    prepared = rl.rank.prepared
    assert prepared is not None
    r, p = prepared.batch.rollout, prepared.batch.rollout.prompt_ids.shape[1]
    b, mask = r.batch_size, model.traits.mask_token_id  # type: ignore[union-attr]
    masked = prepared.data.noisy[:, p:] == mask
    counted = r.response_mask.repeat(K, 1)
    assert torch.equal(prepared.data.active, masked & counted)
    first = prepared.data.active[:b]  # step 0: the all-mask canvas
    assert bool(first[:, : K // 2].any()) and bool(first[:, K // 2:].any())
    assert not bool((prepared.data.clean[:, p:] == mask).any())  # targets (and step rewards) without masks


def test_post_eos_columns_attended_and_not_trained(run: dict[str, Any]) -> None:
    """A deliberate difference (docs/algorithms.md#mdpo): DARE's rows take the final response's
    attention mask (dllm_ray_trainer.py:737,765; mdpo_llada_rollout.py:290-297), so the columns after
    the first EOS are dropped from the packed forward (llada_dp_actor_mdpo.py:118-121) while their
    masked positions stay in the completion mask with zero logits (log-prob -log V under both the old
    and the new policy: ratio 1, no gradient, counted in lam = R / |m| and in the mean). Ours scores
    every row on the canvas the rollout decoded from, all response columns attended, as the policy saw
    it, and trains only the response's counted positions."""
    batch = run["prepared"].batch
    counted = batch.rollout.response_mask.clone()
    counted[:, K // 2:] = False  # as if every response ended at column K / 2 - 1
    batch = dataclasses.replace(batch, rollout=dataclasses.replace(batch.rollout, response_mask=counted))
    data = da.MDPO().prepare(batch, torch.Generator().manual_seed(0))
    p = batch.rollout.prompt_ids.shape[1]
    assert bool(data.attention[:, p:].all())
    assert torch.equal(data.attention[:, :p], batch.rollout.prompt_mask.repeat(K, 1))
    masked = data.noisy[:, p:] == batch.tokens.mask_id
    assert torch.equal(data.active, masked & counted.repeat(K, 1))
    assert bool((masked & ~counted.repeat(K, 1)).any())  # post-EOS masked positions exist and are not trained
