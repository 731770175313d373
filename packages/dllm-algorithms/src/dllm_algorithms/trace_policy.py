"""TraceRL (Wang et al., arXiv 2509.06949; Gen-Verse/dLLM-RL at 10b4fd1): a policy gradient over
the rollout's own inference trace (docs/algorithms.md#tracerl).

The trace is the rollout's unmask step of every decoded position. Consecutive steps are merged
`shrink` at a time; each merged step is one training row that masks it and every later step and
scores its tokens (block models: every block at its own k-th merged step in the same row, on the
BD3LM clean/noisy layout, the authors' "sliced" block training). Without a value model (the
authors' configs/rl_sdar.yaml, rl_llada.yaml, rl_dream.yaml) every token of a sample shares its
group-normalised reward; with one (`value_model=True`, configs/rl_sdar_with_value.yaml) each token
gets the step-level GAE advantage of its merged step from a value model trained beside the policy
(`dllm_train.critic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from dllm_objectives import (
    MaskPlan,
    block_ids,
    grpo_advantages,
    outcome_token_rewards,
    replay_plan,
    replay_rounds,
    shrink_steps,
    trace_group_filter,
    trace_policy_loss,
    trace_returns_and_advantages,
    trace_value_loss,
)
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import (
    CriticInputs,
    CriticSpec,
    CriticTargets,
    LossInputs,
    RLAlgorithm,
    RLBatch,
    ValuesScorer,
    plan_token_logp,
    with_fields,
)

from dllm_algorithms.cj_replay import replay_response
from dllm_algorithms.families import BLOCK, MASKED
from dllm_algorithms.scoring import Metrics, is_block


def trace_positions(rollout: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(step map [B, R], replayed positions [B, R]) of a rollout's inference trace.

    Masked models: every decoded position (the authors' step map covers the whole generated canvas,
    train/rl_llada.py:256-260; positions past the stop are context, not trained). Block models:
    the response through the end of its terminal block (`replay_response`), the positions after
    the stop given one step after the row's last (train/rl_sdar.py:283-286 pads the step map so).

    Raises:
        ValueError: the rollout recorded no unmask steps.
    """
    if rollout.unmask_step is None:
        raise ValueError("TraceRL needs rollout.unmask_step: decode with SamplingConfig.record_trajectory=True "
                         "(the algorithm's sampling() sets it)")
    if not is_block(rollout):
        positions = rollout.unmask_step >= 0
        return torch.where(positions, rollout.unmask_step, -1), positions
    positions = replay_response(rollout)
    step = torch.where(positions, rollout.unmask_step, -1)
    tail = positions & ~rollout.response_mask
    last = torch.where(tail, -1, step).max(-1, keepdim=True).values
    return torch.where(tail, last + 1, step), positions


@dataclass(frozen=True)
class TraceRows:
    """TraceRL's training rows as a plan over the batch.

    Attributes:
        plan: copy k of sample b is its k-th replay round (mask [B, K, S], S = P + R).
        merged: long [B, S] merged step of each position (-1: the prompt, off the trace).
        attention: [B, S] real positions (prompt and replayed response).
        active: [B, K, S] bool, the tokens each row trains (scored, counted, kept group).
        length: the loss's per-row divisor on block models (the longest replayed response).
        num_rows: rows with at least one trained token (the mean's denominator).
    """

    plan: MaskPlan
    merged: torch.Tensor
    attention: torch.Tensor
    active: torch.Tensor
    length: int
    num_rows: int


@dataclass(frozen=True, kw_only=True)
class TraceRL(RLAlgorithm[TraceRows]):
    """TraceRL (Wang et al., arXiv 2509.06949): trajectory-aware RL on the rollout's inference trace.

    Merges every `shrink` consecutive unmask steps (per block on block models), replays each merged
    step as one row (mask it and later steps, score it), and trains the scored tokens with a clipped
    ratio (clip `clip`) and a k3 KL (`kl_coef`) to the rollout policy. Advantages: the reward
    z-scored within its group (population std, 0 for an all-equal group), and groups whose mean
    score is outside [`min_group_accuracy`, `max_group_accuracy`] are left out (reward/rl_reward.py:
    74-79, 112-114). Reduction: block models sum each row over the longest replayed response
    (train/rl_sdar.py:741-755), masked models take each row's token mean (train/rl_llada.py:589-602);
    rows are averaged. With `value_model`: a value model (a copy of the policy with a zero scalar
    head) scores the same rows; each trained token's advantage is the step-level GAE of its merged
    step on the z-scored reward (`outcome_token_rewards`, `trace_returns_and_advantages`,
    train/train_sdar_value.py:716-846) and the value model is trained on the clipped value loss
    (`trace_value_loss`, :983-1005) with its own AdamW. Equality: tests/dllm_objectives/
    test_trace_parity.py, tests/dllm_algorithms/test_tracerl_parity.py and
    tests/dllm_algorithms/test_tracerl_value_parity.py.

    Attributes:
        shrink: consecutive distinct unmask steps merged into one training row (>= 1).
        clip: symmetric clip range of the ratio (`training.eps`).
        kl_coef: weight of the k3 KL to the rollout policy (`training.beta`; 0: off).
        min_group_accuracy, max_group_accuracy: the kept range of a group's mean score.
        value_model: train a value model and use its step-level advantages (the authors'
            `*_with_value.yaml` configs); False: the z-scored reward on every token.
        gamma, lam: the discount (`training.gam`) and GAE lambda (`training.lam`) of the returns.
        value_clip: the value loss's clip range (the authors' `training.eps`, shared with `clip`).
        value_lr: the value model's learning rate (`optimizer.params.value_learning_rate`).
        value_every: train the value model at every `value_every`-th step (`train_value_every`).
    """

    shrink: int = 1
    clip: float = 0.2
    kl_coef: float = 0.01
    min_group_accuracy: float = 0.2
    max_group_accuracy: float = 0.8
    value_model: bool = False
    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.2
    value_lr: float = 5e-6
    value_every: int = 1
    # the families its authors train (LLaDA, Dream, SDAR and TraDo, dense or MoE; dLLM-RL has no LLaDA2 trainer)
    families: ClassVar[tuple[str, ...]] = (*MASKED, *(f for f in BLOCK if f.startswith("sdar")))
    record_fields: ClassVar[frozenset[str]] = frozenset({"unmask_step"})
    row_local = True
    replays_trajectory = True
    values_vary_by_iteration = False

    def __post_init__(self) -> None:
        if self.shrink < 1:
            raise ValueError(f"algorithm.shrink must be >= 1 (unmask steps merged per training row), got {self.shrink}")
        if not 0.0 <= self.clip < 1.0:
            raise ValueError(f"algorithm.clip must lie in [0, 1), got {self.clip}; the authors use 0.2")
        if not self.kl_coef >= 0.0:
            raise ValueError(f"algorithm.kl_coef must be >= 0 (0: no KL), got {self.kl_coef}")
        lo, hi = self.min_group_accuracy, self.max_group_accuracy
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(f"algorithm.min_group_accuracy={lo} and algorithm.max_group_accuracy={hi} must satisfy "
                             "0 <= min <= max <= 1 (0 and 1 keep every group)")
        self._check_value_fields()

    def _check_value_fields(self) -> None:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"algorithm.{name} must lie in [0, 1], got {value}; the authors use 1.0")
        if not self.value_clip >= 0.0:
            raise ValueError(f"algorithm.value_clip must be >= 0, got {self.value_clip}; the authors use 0.2")
        if not self.value_lr > 0.0:
            raise ValueError(f"algorithm.value_lr must be > 0, got {self.value_lr}; the authors use 5e-6")
        if self.value_every < 1:
            raise ValueError(f"algorithm.value_every must be >= 1 (train the value model every N steps), "
                             f"got {self.value_every}; the authors use 1")

    @property
    def critic(self) -> CriticSpec | None:
        """The value model of `value_model=True` (its learning rate and period), else None."""
        return CriticSpec(lr=self.value_lr, every=self.value_every) if self.value_model else None

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        return with_fields(sampling, record_trajectory=True)

    def advantages(self, scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """The reward z-scored within its group with the population std (reward/rl_reward.py:74-79)."""
        return grpo_advantages(scores, group_ids, eps=0.0, unbiased_std=False)

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> TraceRows:
        r = batch.rollout
        step, positions = trace_positions(r)
        no_prompt = torch.zeros_like(r.prompt_mask)
        full = torch.cat([torch.full_like(r.prompt_ids, -1), step], dim=1)
        attention = torch.cat([r.prompt_mask, positions], dim=1)
        ids = None
        if is_block(r):
            assert r.config is not None
            ids = block_ids(attention, r.config.block_length)
        merged = shrink_steps(full, self.shrink, block_ids=ids)
        plan = replay_plan(replay_rounds(merged, block_ids=ids))
        keep = trace_group_filter(batch.scores, batch.group_ids, low=self.min_group_accuracy,
                                  high=self.max_group_accuracy).to(full.device)
        trained = torch.cat([no_prompt, r.response_mask & positions], dim=1) & keep[:, None]
        active = plan.meta["scored"] & trained[:, None, :]
        replayed = positions.any(0).nonzero()
        length = int(replayed.max()) + 1 if replayed.numel() else 1
        return TraceRows(plan=plan, merged=merged, attention=attention, active=active, length=length,
                         num_rows=int(active.any(-1).sum()))

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: TraceRows, iteration: int) -> torch.Tensor:
        lp = plan_token_logp(scorer, batch.rollout.input_ids, data.attention, data.plan)
        return lp * data.active.to(lp.dtype)

    def loss(self, values: torch.Tensor, inputs: LossInputs[TraceRows]) -> tuple[torch.Tensor, Metrics]:
        assert inputs.old is not None
        b, k, s = values.shape
        d = inputs.data
        if inputs.critic is not None:  # the value model's per-token advantages, [B, K, S]
            adv = inputs.critic.advantages.to(values.dtype).reshape(b * k, s)
        else:
            adv = inputs.advantages.to(values.dtype)[:, None].expand(b, k).reshape(b * k)
        return trace_policy_loss(values.reshape(b * k, s), inputs.old.reshape(b * k, s), adv,
                                 d.active.reshape(b * k, s), clip=self.clip, kl_coef=self.kl_coef,
                                 normalization="length" if is_block(inputs.batch.rollout) else "tokens",
                                 length=d.length, num_rows=max(d.num_rows, 1))

    def critic_values(self, scorer: ValuesScorer, batch: RLBatch, data: TraceRows) -> torch.Tensor:
        """The value model's values [B, K, S] at each row's trained tokens (0 elsewhere), on the
        policy's rows (train/train_sdar_value.py:635-683): `values` read through the value model's scorer."""
        return self.values(scorer, batch, data, iteration=0)

    def critic_targets(self, batch: RLBatch, data: TraceRows, old: torch.Tensor,
                       advantages: torch.Tensor) -> CriticTargets:
        """Per-token advantages and returns [B, K, S] on each row's trained tokens.

        Each trained token is scored in one row, so the rows' sum is its old value; the outcome
        reward is the z-scored reward (`advantages`, reward/rl_reward.py:105-121) on the tokens of
        the last merged step (train/train_sdar_value.py:771-779); the step-level GAE along the
        merged steps gives returns and advantages (:804-846).
        """
        act = data.active.to(old.dtype)
        trained = data.active.any(1)
        rewards = outcome_token_rewards(data.merged, advantages.to(old.dtype), trained)
        returns, adv = trace_returns_and_advantages(data.merged, rewards, (old * act).sum(1), trained,
                                                    gamma=self.gamma, lam=self.lam)
        return CriticTargets(advantages=adv[:, None, :] * act, returns=returns[:, None, :] * act)

    def critic_loss(self, values: torch.Tensor, inputs: CriticInputs[TraceRows]) -> tuple[torch.Tensor, Metrics]:
        """The clipped value loss over the rows (train/train_sdar_value.py:983-1005): each row's sum
        over the longest replayed response, the rows averaged (those with a trained token)."""
        b, k, s = values.shape
        d = inputs.data

        def rows(x: torch.Tensor) -> torch.Tensor:  # [B, K, S] -> the [B K, S] training rows
            return x.to(values.dtype).reshape(b * k, s)

        active, current, returns = d.active.reshape(b * k, s), rows(values), rows(inputs.targets.returns)
        loss = trace_value_loss(current, rows(inputs.old), returns, active,
                                clip=self.value_clip, length=d.length, num_rows=max(d.num_rows, 1))
        with torch.no_grad():
            tokens = active.sum().clamp_min(1)
            mean_value = (current * active).sum() / tokens
            mean_return = (returns * active).sum() / tokens
        return loss, {"value_loss": loss.detach(), "value_mean": mean_value, "return_mean": mean_return}


__all__ = ["TraceRL", "TraceRows", "trace_positions"]
