"""Sequence-level policy gradients on Monte-Carlo ELBOs of whole responses.

BGPO (linear lower bound, one backward per MC sample), ESPO (antithetic ELBO ratio with proxy
backward), EBPO (composite block ELBO of block-diffusion models) and SPG (ELBO / EUBO sandwich).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from dllm_objectives import (
    MaskPlan,
    antithetic_elbo,
    bgpo_policy_loss,
    block_count_masks,
    block_ids,
    composite_block_elbo,
    count_masks,
    elbo,
    espo_masks,
    per_sample_backward,
    proxy_backward,
    rloo_advantages,
    sequence_clip_loss,
    sequence_kl,
    spg_block_masks,
    spg_loss,
    spg_sequence_logp,
)
from dllm_rollout import RolloutBatch
from dllm_train import Experience, PolicyObjective, RLConfig, Scorer, at_iteration, sequence_inputs

from dare.algorithms.common import (
    ALL_FAMILIES,
    BLOCK,
    MASKED,
    Clip,
    current_plan,
    grpo,
    is_block,
    plan_logp,
    slice_plan,
)

Metrics = dict[str, torch.Tensor]


def _elbo_normalizer(rollout: RolloutBatch) -> float | torch.Tensor:
    """Masked families: ÷ padded response length R; block families: ÷ valid length L_i (spec §2.4)."""
    if is_block(rollout):
        return rollout.response_mask.sum(-1).clamp(min=1)
    return float(rollout.response_ids.shape[1])


@dataclass(frozen=True)
class BGPO:
    """BGPO (Lin et al., arXiv 2510.11683): per-MC-sample linear lower bound of the ELBO ratio.

    N stratified-count masks; per sample the normalised ELBO l_i enters a PPO surrogate with
    ratio 1 + (l_i - l_i^old) for A > 0 and exp(.) otherwise; one backward per sample, so
    memory does not grow with N (spec §2.4). Masked and block families.
    """

    mc_num: int = 16
    families: tuple[str, ...] = ALL_FAMILIES

    def build(self, rl: RLConfig) -> PolicyObjective:
        clip = Clip.of(rl)

        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            return count_masks(sequence_inputs(rollout)[3], self.mc_num, generator=gen)

        def values(scorer: Scorer, exp: Experience, sample: slice = slice(None)) -> torch.Tensor:
            sub = exp.plan if sample == slice(None) else slice_plan(exp.plan, sample.start, sample.stop)
            return elbo(plan_logp(scorer, exp, sub), sub, normalizer=_elbo_normalizer(exp.rollout))

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            return values(scorer, exp)

        def loss(value: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, exp: Experience) -> tuple[torch.Tensor, Metrics]:
            # mean over samples of the per-sample surrogate (the objective BGPO bounds)
            parts = [bgpo_policy_loss(value[:, i], old[:, i], adv, exp.rollout.response_mask,
                                      clip_low=clip.low, clip_high=clip.high, dual_clip=clip.dual)
                     for i in range(value.shape[1])]
            return torch.stack([p[0] for p in parts]).mean(), parts[-1][1]

        def update(obj: PolicyObjective, scorer: Scorer, exp: Experience) -> tuple[torch.Tensor, Metrics]:
            old = at_iteration(exp.old_logp, exp, obj.num_iterations)
            assert old is not None and exp.advantages is not None
            metrics: Metrics = {}

            def sample_loss(i: int) -> torch.Tensor:
                out, m = obj.loss(values(scorer, exp, slice(i, i + 1)), old[:, i:i + 1], exp.advantages, exp)
                metrics.update(m)
                return out

            total = per_sample_backward([partial(sample_loss, i) for i in range(self.mc_num)])
            return total, metrics

        return PolicyObjective(name="bgpo", score=score, advantages=grpo, loss=loss, sample_plan=plan,
                               update=update)


def _proxy_update(values_of: Callable[[Scorer, Experience, int], torch.Tensor], num: int) -> Callable[..., Any]:
    """Proxy backward (ESPO/EBPO, spec §2.6): value pass without grad, then one pass per sample."""

    def update(obj: PolicyObjective, scorer: Scorer, exp: Experience) -> tuple[torch.Tensor, Metrics]:
        old = at_iteration(exp.old_logp, exp, obj.num_iterations)
        assert exp.advantages is not None
        metrics: Metrics = {}

        def objective(v: torch.Tensor) -> torch.Tensor:
            out, m = obj.loss(v, old, exp.advantages, exp)
            metrics.update({k: t.detach() for k, t in m.items()})
            return out

        fns = [partial(values_of, scorer, exp, m) for m in range(num)]
        return proxy_backward(objective, fns), metrics

    return update


def _sequence_loss(clip: Clip, kl_coef: float, kl_kind: str, kl_length: Callable[[Experience], float],
                   num_iterations: int) -> Callable[..., tuple[torch.Tensor, Metrics]]:
    def loss(value: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, exp: Experience) -> tuple[torch.Tensor, Metrics]:
        pg, metrics = sequence_clip_loss(value, old, adv, clip_low=clip.low, clip_high=clip.high)
        ref = at_iteration(exp.ref_logp, exp, num_iterations)
        if kl_coef and ref is not None:
            length = kl_length(exp)
            kl = sequence_kl(value * length, ref * length, kl_kind, length=length).mean()
            metrics = {**metrics, "kl": kl.detach()}
            pg = pg + kl_coef * kl
        return pg, metrics
    return loss


@dataclass(frozen=True)
class ESPO:
    """ESPO (Ou et al., arXiv 2512.03759): sequence-level clipped ratio of antithetic ELBOs.

    Per iteration fresh count masks stratified across the batch plus their complements;
    l = ELBO / R; RLOO advantages; clipped sequence ratio + k2 KL to the reference on raw
    ELBOs / R; proxy backward over the MC samples (spec §2.6). Off-policy: `num_iterations`
    optimizer steps per rollout batch.
    """

    mc_num: int = 2
    num_iterations: int = 8
    kl_coef: float = 1e-3
    kl_kind: str = "k2"
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        def plan(rollout: RolloutBatch, gen: torch.Generator) -> tuple[MaskPlan, MaskPlan]:
            return espo_masks(sequence_inputs(rollout)[3], self.mc_num, generator=gen)

        def values_of(scorer: Scorer, exp: Experience, m: int | None) -> torch.Tensor:
            p, c = current_plan(exp, self.num_iterations)
            if m is not None:
                p, c = slice_plan(p, m, m + 1), slice_plan(c, m, m + 1)
            width = float(exp.rollout.response_ids.shape[1])
            v = antithetic_elbo(plan_logp(scorer, exp, p), plan_logp(scorer, exp, c), p, c, normalizer=width)
            return v.mean(-1)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            return values_of(scorer, exp, None)

        return PolicyObjective(
            name="espo", score=score, advantages=lambda s, g: rloo_advantages(s, g),
            loss=_sequence_loss(Clip.of(rl), self.kl_coef, self.kl_kind,
                                lambda exp: float(exp.rollout.response_ids.shape[1]), self.num_iterations),
            sample_plan=plan, update=_proxy_update(values_of, self.mc_num),
            needs_reference=self.kl_coef > 0, num_iterations=self.num_iterations)


@dataclass(frozen=True)
class EBPO:
    """EBPO (LLaDA2.1, arXiv 2602.08676 Eq. 4-5): clipped ratio of composite block ELBOs.

    Every response block of every MC row gets its own stratified count; with the BD3LM layout
    one forward per row scores all blocks; raw (unnormalised) composite ELBO; log-domain clipped
    sequence ratio; proxy backward (spec §2.7). Block families only.
    """

    mc_num: int = 16
    kl_coef: float = 0.0
    kl_kind: str = "k2"
    families: tuple[str, ...] = BLOCK

    def build(self, rl: RLConfig) -> PolicyObjective:
        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            if rollout.config is None or not rollout.config.block_diffusion:
                raise ValueError("ebpo is defined for block-diffusion models (SDAR, LLaDA2) only")
            _, attn, _, response_valid = sequence_inputs(rollout)
            ids = block_ids(attn, rollout.config.block_length)
            return block_count_masks(response_valid, ids, self.mc_num, generator=gen)

        def values_of(scorer: Scorer, exp: Experience, m: int | None) -> torch.Tensor:
            p = exp.plan if m is None else slice_plan(exp.plan, m, m + 1)
            return composite_block_elbo(plan_logp(scorer, exp, p), p)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            return values_of(scorer, exp, None)

        return PolicyObjective(
            name="ebpo", score=score, advantages=grpo,
            loss=_sequence_loss(Clip.of(rl), self.kl_coef, self.kl_kind, lambda exp: 1.0, 1),
            sample_plan=plan, update=_proxy_update(values_of, self.mc_num), needs_reference=self.kl_coef > 0)


@dataclass(frozen=True)
class SPG:
    """SPG (Wang et al., arXiv 2510.09541): ELBO for positive, ELBO/EUBO mix for negative rewards.

    Block-wise random masks (later blocks fully, one block partially, earlier blocks and the
    prompt at 15%); REINFORCE with length-weighted sequence advantages, no ratio, no old or
    reference values (spec §2.5). `num_iterations` optimizer steps per rollout batch, each on its
    own mask set (the reference trainer's `num_iterations`); the later ones are off-policy, yet
    the loss stays plain REINFORCE on the current policy: no ratio, no clipping.
    """

    mc_num: int = 1
    eubo_beta: float = 1.5
    mix_weight: float = 0.5
    negative: str = "mix"
    block_length: int | None = None
    num_iterations: int = 1
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            _, _, prompt_valid, response_valid = sequence_inputs(rollout)
            blk = self.block_length or (rollout.config.block_length if rollout.config else 32)
            return spg_block_masks(prompt_valid, response_valid, self.mc_num,
                                   response_start=rollout.prompt_ids.shape[1], block_length=blk, generator=gen)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            assert exp.advantages is not None
            masks = current_plan(exp, self.num_iterations)
            lp = plan_logp(scorer, exp, masks)
            return spg_sequence_logp(lp, masks, sequence_inputs(exp.rollout)[3], exp.advantages > 0,
                                     negative=self.negative, eubo_beta=self.eubo_beta, mix_weight=self.mix_weight)

        def loss(value: torch.Tensor, old: torch.Tensor | None, adv: torch.Tensor,
                 exp: Experience) -> tuple[torch.Tensor, Metrics]:
            return spg_loss(value, adv, exp.rollout.response_mask.sum(-1)), {}

        return PolicyObjective(name="spg", score=score, advantages=grpo, loss=loss, sample_plan=plan,
                               needs_old=False, num_iterations=self.num_iterations)
