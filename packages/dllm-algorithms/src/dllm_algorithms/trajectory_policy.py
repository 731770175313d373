"""Policy gradients that replay the rollout's own denoising path.

CJ-GRPO (every step of the trajectory is an action) and MDPO (intermediate predictions rewarded
per step); their training rows (`TrainingRows`) serve d-TreeRPO too (`tree_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_objectives import (
    MaskPlan,
    block_ids,
    cj_token_weights,
    mdpo_loss,
    mdpo_step_advantages,
    mdpo_topk_steps,
    replay_plan,
    weighted_policy_loss,
)
from dllm_rollout import RolloutBatch
from dllm_train import LossInputs, MiniBatchRows, RLAlgorithm, RLBatch, ValuesScorer, plan_token_logp

from dllm_algorithms.cj_replay import replay_response
from dllm_algorithms.clipping import DualClip
from dllm_algorithms.families import ALL_FAMILIES, MASKED
from dllm_algorithms.scoring import Metrics, inputs, is_block


def trajectory_steps(rollout: RolloutBatch, response: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Step map [B, P + R] (-1 off the replayed response) and the number of replay states K.

    Masked models: the global unmask step. Block models: the step local to the token's block
    (all blocks are replayed in parallel at the same local step).

    Args:
        response: [B, R] bool, the replayed response positions (default `rollout.response_mask`;
            CJ-GRPO passes `replay_response`).
    """
    if rollout.unmask_step is None:
        raise ValueError("trajectory replay needs rollout.unmask_step (SamplingConfig.record_trajectory=True)")
    response = rollout.response_mask if response is None else response
    step = torch.where(response, rollout.unmask_step, -1)
    full = torch.cat([torch.full_like(rollout.prompt_ids, -1), step], dim=1)
    if is_block(rollout):
        assert rollout.config is not None
        ids = block_ids(torch.cat([rollout.prompt_mask, response], dim=1), rollout.config.block_length)
        big = torch.iinfo(full.dtype).max
        local = full.clone()
        for b in torch.unique(ids[full >= 0]).tolist():
            inside = (ids == b) & (full >= 0)
            first = torch.where(inside, full, big).min(-1, keepdim=True).values
            local = torch.where(inside, full - first, local)
        full = local
    return full, int(full.max().clamp(min=0)) + 1


@dataclass(frozen=True)
class Trajectory:
    """CJ-GRPO's replay: one plan copy per state, each token's weight in the loss [B, K, S], and the
    replay view's attention [B, S] (prompt and `replay_response`)."""

    plan: MaskPlan
    weights: torch.Tensor
    attention: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class CJGRPO(DualClip, RLAlgorithm[Trajectory]):
    """CJ-GRPO (Yang et al., arXiv 2509.23924): consistency-trajectory GRPO.

    Replays the recorded unmasking order: state k reveals the tokens committed before step k;
    the tokens committed at k are scored from it (one scored row per state); per-step token
    means (masked) or the paper-exact per-transition weights (block models). On block models the
    terminal block is replayed completely (`replay_response`: the tokens after the stop inside it
    are context and actions of the same advantage); DARE's rollouts also end each response on the
    block grid (`SamplingConfig.block_aligned_budget`, set by the block CJ-GRPO recipes).
    """

    families: ClassVar[tuple[str, ...]] = ALL_FAMILIES
    row_local = True
    record_fields = frozenset({"unmask_step"})

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> Trajectory:
        rollout = batch.rollout
        response = replay_response(rollout)
        attention = torch.cat([rollout.prompt_mask, response], dim=1)
        step, k = trajectory_steps(rollout, response)
        plan = replay_plan(step, k)
        if is_block(rollout):
            assert rollout.config is not None
            ids = block_ids(attention, rollout.config.block_length)
            weights = cj_token_weights(step, k, block_ids=ids, mode="paper_exact")
        else:
            weights = cj_token_weights(step, k, mode="step_token_mean")
        return Trajectory(plan=plan, weights=weights, attention=attention)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: Trajectory, iteration: int) -> torch.Tensor:
        lp = plan_token_logp(scorer, batch.rollout.input_ids, data.attention, data.plan)
        return lp * data.plan.meta["scored"].to(lp.dtype)

    def loss(self, values: torch.Tensor, inputs: LossInputs[Trajectory]) -> tuple[torch.Tensor, Metrics]:
        assert inputs.old is not None
        b, k, s = values.shape
        return weighted_policy_loss(values.reshape(b, k * s), inputs.old.reshape(b, k * s), inputs.advantages[:, None],
                                    inputs.data.weights.reshape(b, k * s), clip_low=self.clip_low,
                                    clip_high=self.clip_high, dual_clip=self.dual_clip)


def _rows(prompt: torch.Tensor, prompt_mask: torch.Tensor, response: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.cat([prompt, response], dim=1)
    attn = torch.cat([prompt_mask, torch.ones_like(response, dtype=torch.bool)], dim=1)
    return ids, attn


@dataclass(frozen=True)
class TrainingRows:
    """Rows scored by a single scorer call: inputs, targets, and what the loss weighs them by.

    Attributes:
        noisy, clean, attention: [M, P + R] input canvas, target tokens, real positions.
        advantages: [M] advantage of each row.
        active: [M, R] bool, the response positions the loss counts.
        confidence: [M, R] rollout confidence of each position (MDPO), or None.
    """

    noisy: torch.Tensor
    clean: torch.Tensor
    attention: torch.Tensor
    advantages: torch.Tensor
    active: torch.Tensor
    confidence: torch.Tensor | None = None

    def select(self, rows: slice) -> TrainingRows:
        """The rows `rows` of every field."""
        return TrainingRows(noisy=self.noisy[rows], clean=self.clean[rows], attention=self.attention[rows],
                            advantages=self.advantages[rows], active=self.active[rows],
                            confidence=self.confidence[rows] if self.confidence is not None else None)


def _score_rows(scorer: ValuesScorer, batch: RLBatch, rows: TrainingRows) -> torch.Tensor:
    lp: torch.Tensor = scorer(rows.noisy, rows.attention, rows.clean)
    return lp[:, batch.rollout.prompt_ids.shape[1]:]


@dataclass(frozen=True, kw_only=True)
class MDPO(RLAlgorithm[TrainingRows]):
    """MDPO (He et al., arXiv 2508.13148): per-step rewards of intermediate predictions.

    Every denoising step's clean prediction is rewarded; step scores d_t + c_t are normalised
    per group; the top-K steps by total |A| become training rows (input = the step's canvas,
    target = its prediction), weighted by the rollout confidence, with an inverse mask-ratio
    factor. The rows are packed step-major (all samples of the first selected step, then the
    next), and by default each selected step is one mini-batch with its own optimizer step, as
    DARE runs it: K updates per rollout batch, all against the old values of the rollout
    policy, so the ratio and the clip act from the second update on.

    Attributes:
        top_k_steps: denoising steps per sequence (largest total |A|) kept as training rows.
        clip: symmetric clip range of the ratio.
        step_mini_batches: one optimizer step per selected denoising step (DARE's protocol);
            false: a single optimizer step on the rows of every selected step.
    """

    top_k_steps: int = 16
    clip: float = 0.2
    step_mini_batches: bool = True
    families: ClassVar[tuple[str, ...]] = MASKED
    row_local = True
    record_fields = frozenset({"step_canvas", "step_x0", "step_confidence"})

    def __post_init__(self) -> None:
        if self.top_k_steps < 1:
            raise ValueError(f"algorithm.top_k_steps must be >= 1, got {self.top_k_steps}")

    @property
    def mini_batch_rows(self) -> MiniBatchRows:
        return "rollout" if self.step_mini_batches else "all"

    def num_rows(self, data: TrainingRows) -> int:
        return int(data.noisy.shape[0])

    def select_rows(self, data: TrainingRows, rows: slice) -> TrainingRows:
        return data.select(rows)

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> TrainingRows:
        r = batch.rollout
        if r.step_canvas is None or r.step_x0 is None or r.step_confidence is None:
            raise ValueError("MDPO needs step records (SamplingConfig.record_steps=True)")
        if batch.step_scores is None:
            raise ValueError("MDPO needs per-step rewards: score the rollout with dllm_train.RewardWorker")
        rewards = batch.step_scores.to(batch.scores.device)
        last = batch.scores[:, None].expand_as(rewards)
        rewards = torch.where(torch.isnan(rewards), last, rewards)
        adv = mdpo_step_advantages(rewards, batch.group_ids.to(rewards.device))
        steps = mdpo_topk_steps(adv, self.top_k_steps)
        b, k = r.batch_size, len(steps)

        def step_major(x: torch.Tensor) -> torch.Tensor:  # [B, K, ...] -> [K * B, ...], row j * B + i
            return x.transpose(0, 1).reshape(k * b, *x.shape[2:])

        canvas = step_major(r.step_canvas[:, steps])
        target = step_major(r.step_x0[:, steps])
        prompt, pmask = r.prompt_ids.repeat(k, 1), r.prompt_mask.repeat(k, 1)
        noisy, attn = _rows(prompt, pmask, canvas)
        clean, _ = _rows(prompt, pmask, target)
        masked = canvas == batch.tokens.mask_id
        conf = torch.nan_to_num(step_major(r.step_confidence[:, steps]), nan=0.0)
        active = masked & (conf > 0) & r.response_mask.repeat(k, 1)
        advantages = step_major(adv[:, steps]).to(noisy.device)
        return TrainingRows(noisy=noisy, clean=clean, attention=attn, advantages=advantages, active=active,
                            confidence=conf)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: TrainingRows, iteration: int) -> torch.Tensor:
        return _score_rows(scorer, batch, data)

    def loss(self, values: torch.Tensor, inputs: LossInputs[TrainingRows]) -> tuple[torch.Tensor, Metrics]:
        d = inputs.data
        assert inputs.old is not None and d.confidence is not None
        return mdpo_loss(values, inputs.old, d.advantages, d.active, d.confidence, clip=self.clip,
                         max_len=inputs.batch.rollout.response_ids.shape[1])


__all__ = ["CJGRPO", "MDPO", "Trajectory", "TrainingRows", "trajectory_steps"]
