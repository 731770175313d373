"""Token-level policy gradients with one-step or exact per-token likelihoods.

d1 (mean-field one-step log-probs), Coupled-GRPO (complementary masks) and JustGRPO (exact
autoregressive-order log-probs): each token's log-prob enters the PPO clipped surrogate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm_objectives import (
    MaskPlan,
    autoregressive_steps,
    clipped_policy_loss,
    coupled_masks,
    coupled_token_logp,
    one_step_masks,
    replay_plan,
    step_replay,
)
from dllm_rollout import RolloutBatch
from dllm_train import Experience, PolicyObjective, RLConfig, Scorer, at_iteration, lockstep_passes, sequence_inputs

from dare.algorithms.common import MASKED, Clip, grpo, plan_logp, response_part, slice_plan


def _token_loss(clip: Clip) -> object:
    def loss(values: torch.Tensor, old: torch.Tensor, adv: torch.Tensor,
             exp: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return clipped_policy_loss(values, old, adv[:, None] if adv.dim() == 1 else adv,
                                   exp.rollout.response_mask, clip_low=clip.low, clip_high=clip.high,
                                   dual_clip=clip.dual)
    return loss


@dataclass(frozen=True)
class D1:
    """d1 / diffu-GRPO (Zhao et al., arXiv 2504.12216): one-step mean-field token log-probs.

    The whole response and a random 15% of the prompt are masked; one forward gives every
    response token's log-prob; GRPO advantages; PPO clipped surrogate with dual clip.
    """

    prompt_mask_prob: float = 0.15
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            _, _, prompt_valid, response_valid = sequence_inputs(rollout)
            return one_step_masks(prompt_valid, response_valid, prompt_mask_prob=self.prompt_mask_prob,
                                  generator=gen)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            return response_part(plan_logp(scorer, exp, exp.plan)[:, 0], exp.rollout)

        return PolicyObjective(name="d1", score=score, advantages=grpo, loss=_token_loss(Clip.of(rl)),  # type: ignore[arg-type]
                               sample_plan=plan)


@dataclass(frozen=True)
class CoupledGRPO:
    """Coupled-GRPO (DiffuCoder, arXiv 2506.20639): complementary-mask token scores.

    Per row t ~ U[t_min, t_max]; copies: whole response masked, and two complementary halves;
    score 0.5 (l_full + l_a / t + l_b / (1 - t)) in the clipped surrogate (spec §2.2).
    """

    t_min: float = 0.2
    t_max: float = 0.8
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            _, _, _, response_valid = sequence_inputs(rollout)
            return coupled_masks(response_valid, t_min=self.t_min, t_max=self.t_max, include_full=True,
                                 generator=gen)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            lp = plan_logp(scorer, exp, exp.plan)
            halves = slice_plan(exp.plan, 1, 3)
            return response_part(coupled_token_logp(lp[:, 0], lp[:, 1:], halves), exp.rollout)

        return PolicyObjective(name="coupled-grpo", score=score, advantages=grpo,
                               loss=_token_loss(Clip.of(rl)), sample_plan=plan)  # type: ignore[arg-type]


@dataclass(frozen=True)
class JustGRPO:
    """JustGRPO (Ni et al., arXiv 2601.15165): exact left-to-right log-probs of a dLLM.

    State j = prompt + o_<j with o_>=j masked; log softmax(f / T)[o_j] with the rollout
    temperature T; positions replayed in chunks with one backward each (spec §2.11). The
    rollout should decode left to right (block length 1, steps = response length).
    """

    temperature: float = 0.6
    chunk_size: int = 8
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        clip = Clip.of(rl)

        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            _, _, _, response_valid = sequence_inputs(rollout)
            return replay_plan(autoregressive_steps(response_valid))

        def chunk_scores(scorer: Scorer, exp: Experience, start: int, stop: int) -> torch.Tensor:
            sub = slice_plan(exp.plan, start, stop)
            lp = plan_logp(scorer, exp, sub, temperature=self.temperature)
            return response_part((lp * sub.meta["scored"].float()).sum(1), exp.rollout)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            n = exp.plan.num_samples  # the longest response of this rank's rows
            starts = range(0, n, self.chunk_size)
            passes = lockstep_passes(scorer, len(starts))  # agreed before any pass runs
            parts = [chunk_scores(scorer, exp, a, min(n, a + self.chunk_size)) for a in starts]
            for _ in range(passes - len(parts)):
                scorer.idle_pass()  # another rank of the FSDP2 group scores more chunks
            return torch.stack(parts).sum(0)

        def loss(values: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, exp: Experience,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            valid = exp.rollout.response_mask
            total = float(valid.sum().clamp(min=1))
            return clipped_policy_loss(values, old, adv[:, None], valid if mask is None else mask,
                                       clip_low=clip.low, clip_high=clip.high, dual_clip=clip.dual,
                                       agg="seq-mean-token-sum-norm", norm_const=total)

        def update(obj: PolicyObjective, scorer: Scorer, exp: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            n = exp.plan.num_samples
            starts = list(range(0, n, self.chunk_size))
            old = at_iteration(exp.old_logp, exp, obj.num_iterations)
            assert old is not None and exp.advantages is not None
            metrics: dict[str, torch.Tensor] = {}

            def step_loss(k: int) -> torch.Tensor:
                if k >= len(starts):  # another rank of the FSDP2 group replays more chunks
                    return scorer.idle_pass()
                a = starts[k]
                sub = slice_plan(exp.plan, a, min(n, a + self.chunk_size))
                scored = response_part(sub.meta["scored"].any(1), exp.rollout) & exp.rollout.response_mask
                values = chunk_scores(scorer, exp, a, min(n, a + self.chunk_size))
                out, m = obj.loss(values, old, exp.advantages, exp, scored)
                metrics.update(m)
                return out

            return step_replay(step_loss, lockstep_passes(scorer, len(starts))), metrics

        return PolicyObjective(name="justgrpo", score=score, advantages=grpo, loss=loss, sample_plan=plan,
                               update=update, sampling_overrides={})
