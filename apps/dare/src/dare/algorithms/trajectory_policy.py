"""Policy gradients that replay the rollout's own denoising path.

CJ-GRPO (every step of the trajectory is an action), MDPO (intermediate predictions rewarded
per step) and d-TreeRPO (tree search, advantages local to sibling groups).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dllm_objectives import (
    MaskPlan,
    block_ids,
    cj_token_weights,
    mdpo_loss,
    mdpo_step_advantages,
    mdpo_topk_steps,
    replay_plan,
    step_replay,
    tree_active_positions,
    tree_local_advantages,
    tree_policy_loss,
    tree_values,
    weighted_policy_loss,
)
from dllm_rollout import RolloutBatch, SamplingConfig, tree_generate
from dllm_train import Experience, PolicyObjective, RLConfig, Scorer, at_iteration, lockstep_passes, sequence_inputs

from dare.algorithms.common import ALL_FAMILIES, MASKED, Clip, grpo, is_block, plan_logp, slice_plan

Metrics = dict[str, torch.Tensor]


def trajectory_steps(rollout: RolloutBatch) -> tuple[torch.Tensor, int]:
    """Step map [B, P + R] (-1 off the response) and the number of replay states K.

    Masked models: the global unmask step. Block models: the step local to the token's block
    (all blocks are replayed in parallel at the same local step, spec §2.8).
    """
    if rollout.unmask_step is None:
        raise ValueError("trajectory replay needs rollout.unmask_step (SamplingConfig.record_trajectory=True)")
    step = torch.where(rollout.response_mask, rollout.unmask_step, -1)
    full = torch.cat([torch.full_like(rollout.prompt_ids, -1), step], dim=1)
    if is_block(rollout):
        assert rollout.config is not None
        _, attn, _, _ = sequence_inputs(rollout)
        ids = block_ids(attn, rollout.config.block_length)
        big = torch.iinfo(full.dtype).max
        local = full.clone()
        for b in torch.unique(ids[full >= 0]).tolist():
            inside = (ids == b) & (full >= 0)
            first = torch.where(inside, full, big).min(-1, keepdim=True).values
            local = torch.where(inside, full - first, local)
        full = local
    return full, int(full.max().clamp(min=0)) + 1


@dataclass(frozen=True)
class CJGRPO:
    """CJ-GRPO (Yang et al., arXiv 2509.23924): consistency-trajectory GRPO.

    Replays the recorded unmasking order: state k reveals the tokens committed before step k;
    the tokens committed at k are scored from it; one backward per state; per-step token means
    (masked) or the paper-exact per-transition weights (block models) (spec §2.8).
    """

    families: tuple[str, ...] = ALL_FAMILIES

    def build(self, rl: RLConfig) -> PolicyObjective:
        clip = Clip.of(rl)

        def plan(rollout: RolloutBatch, gen: torch.Generator) -> MaskPlan:
            step, k = trajectory_steps(rollout)
            p = replay_plan(step, k)
            if is_block(rollout):
                assert rollout.config is not None
                ids = block_ids(sequence_inputs(rollout)[1], rollout.config.block_length)
                w = cj_token_weights(step, k, block_ids=ids, mode="paper_exact")
            else:
                w = cj_token_weights(step, k, mode="step_token_mean")
            return MaskPlan(mask=p.mask, p_mask=p.p_mask, meta={**p.meta, "weights": w})

        def step_values(scorer: Scorer, exp: Experience, k: int | None) -> torch.Tensor:
            p = exp.plan if k is None else slice_plan(exp.plan, k, k + 1)
            return plan_logp(scorer, exp, p) * p.meta["scored"].float()

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            return step_values(scorer, exp, None)

        def loss(value: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, exp: Experience,
                 steps: slice = slice(None)) -> tuple[torch.Tensor, Metrics]:
            w = exp.plan.meta["weights"][:, steps]
            b, k, s = value.shape
            return weighted_policy_loss(value.reshape(b, k * s), old[:, steps].reshape(b, k * s),
                                        adv[:, None], w.reshape(b, k * s),
                                        clip_low=clip.low, clip_high=clip.high, dual_clip=clip.dual)

        def update(obj: PolicyObjective, scorer: Scorer, exp: Experience) -> tuple[torch.Tensor, Metrics]:
            old = at_iteration(exp.old_logp, exp, obj.num_iterations)
            assert old is not None and exp.advantages is not None
            metrics: Metrics = {}
            states = exp.plan.num_samples  # K depends on this rank's trajectories

            def step_loss(k: int) -> torch.Tensor:
                if k >= states:  # another rank of the FSDP2 group replays more states
                    return scorer.idle_pass()
                out, m = obj.loss(step_values(scorer, exp, k), old, exp.advantages, exp, slice(k, k + 1))
                metrics.update(m)
                return out

            return step_replay(step_loss, lockstep_passes(scorer, states)), metrics

        return PolicyObjective(name="cj-grpo", score=score, advantages=grpo, loss=loss, sample_plan=plan,
                               update=update, sampling_overrides={"record_trajectory": True})


def _rows(prompt: torch.Tensor, prompt_mask: torch.Tensor, response: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.cat([prompt, response], dim=1)
    attn = torch.cat([prompt_mask, torch.ones_like(response, dtype=torch.bool)], dim=1)
    return ids, attn


@dataclass(frozen=True)
class MDPO:
    """MDPO (He et al., arXiv 2508.13148): per-step rewards of intermediate predictions.

    Every denoising step's clean prediction is rewarded; step scores d_t + c_t are normalised
    per group; the top-K steps by total |A| become training rows (input = the step's canvas,
    target = its prediction), weighted by the rollout confidence, with an inverse mask-ratio
    factor (spec §2.9).
    """

    top_k_steps: int = 16
    clip: float = 0.2
    families: tuple[str, ...] = MASKED

    def build(self, rl: RLConfig) -> PolicyObjective:
        def prepare(exp: Experience, gen: torch.Generator) -> None:
            r = exp.rollout
            if r.step_canvas is None or r.step_x0 is None or r.step_confidence is None:
                raise ValueError("mdpo needs step records (SamplingConfig.record_steps=True)")
            if "step_scores" not in r.extras:
                raise ValueError("mdpo needs per-step rewards: score the rollout with dllm_train.RewardWorker")
            rewards = r.extras["step_scores"]
            last = exp.scores[:, None].expand_as(rewards)
            rewards = torch.where(torch.isnan(rewards), last, rewards)
            adv = mdpo_step_advantages(rewards, exp.group_ids)
            steps = mdpo_topk_steps(adv, self.top_k_steps)
            b, k = r.batch_size, len(steps)
            canvas = r.step_canvas[:, steps].reshape(b * k, -1)
            target = r.step_x0[:, steps].reshape(b * k, -1)
            prompt = r.prompt_ids.repeat_interleave(k, 0)
            pmask = r.prompt_mask.repeat_interleave(k, 0)
            noisy, attn = _rows(prompt, pmask, canvas)
            clean, _ = _rows(prompt, pmask, target)
            masked = canvas == int(exp.extras["mask_id"])
            conf = torch.nan_to_num(r.step_confidence[:, steps].reshape(b * k, -1), nan=0.0)
            exp.extras.update(rows_noisy=noisy, rows_clean=clean, rows_attn=attn, rows_adv=adv[:, steps].reshape(-1),
                              rows_masked=masked & (conf > 0) & r.response_mask.repeat_interleave(k, 0),
                              rows_conf=conf)

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            e = exp.extras
            lp = scorer(e["rows_noisy"], e["rows_attn"], e["rows_clean"])
            return lp[:, exp.rollout.prompt_ids.shape[1]:]

        def loss(value: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, exp: Experience) -> tuple[torch.Tensor, Metrics]:
            e = exp.extras
            return mdpo_loss(value, old, e["rows_adv"], e["rows_masked"], e["rows_conf"], clip=self.clip,
                             max_len=exp.rollout.response_ids.shape[1])

        return PolicyObjective(name="mdpo", score=score, advantages=grpo, loss=loss, prepare=prepare,
                               sampling_overrides={"record_steps": True, "record_trajectory": True})


@dataclass(frozen=True)
class DTreeRPO:
    """d-TreeRPO (Pan et al., arXiv 2512.09675): tree rollouts with sibling-local advantages.

    Each prompt's group is one tree (`branching ** depth` leaves = the group size): a trunk,
    then `branching` children at each branch step. Node value = mean of its leaves' rewards;
    advantage = value - mean of its siblings; one segment per non-trunk node scores the tokens
    it revealed from its parent's canvas; clipped loss (eps 0.4) + k3 KL to the reference
    (spec §2.10). Self-distillation is not included.
    """

    branching: int = 4
    depth: int = 2
    clip: float = 0.4
    kl_coef: float = 0.01
    num_iterations: int = 12
    families: tuple[str, ...] = MASKED

    def _branch_steps(self, steps: int) -> list[int]:
        out = sorted({max(1, steps * k // (self.depth + 1)) for k in range(1, self.depth + 1)})
        if len(out) != self.depth or out[-1] >= steps:
            raise ValueError(f"d-treerpo: {steps} rollout steps cannot hold {self.depth} branch points")
        return out

    def rollout(self, model: Any, ids: torch.Tensor, mask: torch.Tensor, seeds: torch.Tensor,
                cfg: SamplingConfig, ref_model: Any) -> RolloutBatch:
        g = self.branching ** self.depth
        if ids.shape[0] % g:
            raise ValueError(f"d-treerpo: group size must be branching ** depth = {g}, got a batch of {ids.shape[0]}")
        prompts = [row[m].tolist() for row, m in zip(ids[::g], mask[::g])]
        tree = tree_generate(model, prompts, branch_steps=self._branch_steps(cfg.steps), branching=self.branching,
                             max_new_tokens=cfg.max_new_tokens, steps=cfg.steps, block_length=cfg.block_length,
                             temperature=cfg.temperature, seed=int(seeds[0]), remasking=cfg.remasking,
                             eos_handling=cfg.eos_handling)
        leaves = tree.leaves
        path = [tree.leaf_node]
        while True:
            up = tree.node_parent[path[0]]
            if bool((up < 0).all()):
                break
            path.insert(0, up)
        nodes = torch.stack(path, 1)  # [B, depth + 1], trunk first
        leaves.extras.update(tree_nodes=nodes, tree_canvas=tree.node_response[nodes])
        return leaves

    def build(self, rl: RLConfig) -> PolicyObjective:
        def prepare(exp: Experience, gen: torch.Generator) -> None:
            r = exp.rollout
            nodes, canvas = r.extras["tree_nodes"], r.extras["tree_canvas"]
            uniq, first_row = {}, {}
            for i, row in enumerate(nodes.tolist()):
                for d, n in enumerate(row):
                    if n not in uniq:
                        uniq[n] = (row[d - 1] if d else -1, d)
                        first_row[n] = i
            order = sorted(uniq)
            index = {n: j for j, n in enumerate(order)}
            parent = torch.tensor([index[uniq[n][0]] if uniq[n][0] >= 0 else -1 for n in order])
            leaf_reward = torch.full((len(order),), float("nan"))
            leaf_reward[[index[n] for n in nodes[:, -1].tolist()]] = exp.scores
            adv = tree_local_advantages(parent, tree_values(parent, leaf_reward))
            segs = [n for n in order if uniq[n][0] >= 0]
            rows = torch.tensor([first_row[n] for n in segs])
            depth = torch.tensor([uniq[n][1] for n in segs])
            child = canvas[rows, depth]
            par = canvas[rows, depth - 1]
            noisy, attn = _rows(r.prompt_ids[rows], r.prompt_mask[rows], par)
            clean, _ = _rows(r.prompt_ids[rows], r.prompt_mask[rows], child)
            mask_id, eos_id = int(exp.extras["mask_id"]), int(exp.extras["eos_id"])
            exp.extras.update(seg_noisy=noisy, seg_clean=clean, seg_attn=attn,
                              seg_adv=adv[[index[n] for n in segs]],
                              seg_active=tree_active_positions(par, child, mask_id, eos_id))

        def score(scorer: Scorer, exp: Experience) -> torch.Tensor:
            e = exp.extras
            lp = scorer(e["seg_noisy"], e["seg_attn"], e["seg_clean"])
            return lp[:, exp.rollout.prompt_ids.shape[1]:]

        def loss(value: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, exp: Experience) -> tuple[torch.Tensor, Metrics]:
            e = exp.extras
            ref = at_iteration(exp.ref_logp, exp, self.num_iterations)
            return tree_policy_loss(value, old, e["seg_adv"], e["seg_active"], clip=self.clip,
                                    ref_logp=ref, kl_coef=self.kl_coef if ref is not None else 0.0)

        return PolicyObjective(name="d-treerpo", score=score, advantages=grpo, loss=loss, prepare=prepare,
                               rollout=self.rollout, needs_reference=self.kl_coef > 0,
                               num_iterations=self.num_iterations)
