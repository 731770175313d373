"""Policy gradients that replay the rollout's own denoising path.

CJ-GRPO (every step of the trajectory is an action), MDPO (intermediate predictions rewarded
per step) and d-TreeRPO (tree search, advantages local to sibling groups).
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
    tree_active_positions,
    tree_local_advantages,
    tree_policy_loss,
    tree_values,
    weighted_policy_loss,
)
from dllm_rollout import RolloutBatch, SamplingConfig, tree_generate
from dllm_train import LossInputs, MiniBatchRows, RLAlgorithm, RLBatch, ValuesScorer, with_fields

from dllm_algorithms.clipping import DualClip
from dllm_algorithms.families import ALL_FAMILIES, MASKED
from dllm_algorithms.scoring import Metrics, inputs, is_block, plan_logp


def trajectory_steps(rollout: RolloutBatch) -> tuple[torch.Tensor, int]:
    """Step map [B, P + R] (-1 off the response) and the number of replay states K.

    Masked models: the global unmask step. Block models: the step local to the token's block
    (all blocks are replayed in parallel at the same local step).
    """
    if rollout.unmask_step is None:
        raise ValueError("trajectory replay needs rollout.unmask_step (SamplingConfig.record_trajectory=True)")
    step = torch.where(rollout.response_mask, rollout.unmask_step, -1)
    full = torch.cat([torch.full_like(rollout.prompt_ids, -1), step], dim=1)
    if is_block(rollout):
        assert rollout.config is not None
        ids = block_ids(rollout.attention_mask, rollout.config.block_length)
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
    """CJ-GRPO's replay: one plan copy per state, and each token's weight in the loss [B, K, S]."""

    plan: MaskPlan
    weights: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class CJGRPO(DualClip, RLAlgorithm[Trajectory]):
    """CJ-GRPO (Yang et al., arXiv 2509.23924): consistency-trajectory GRPO.

    Replays the recorded unmasking order: state k reveals the tokens committed before step k;
    the tokens committed at k are scored from it (one scored row per state); per-step token
    means (masked) or the paper-exact per-transition weights (block models).
    """

    families: ClassVar[tuple[str, ...]] = ALL_FAMILIES
    row_local = True
    replays_trajectory = True

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        return with_fields(sampling, record_trajectory=True)

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> Trajectory:
        rollout = batch.rollout
        step, k = trajectory_steps(rollout)
        plan = replay_plan(step, k)
        if is_block(rollout):
            assert rollout.config is not None
            ids = block_ids(rollout.attention_mask, rollout.config.block_length)
            weights = cj_token_weights(step, k, block_ids=ids, mode="paper_exact")
        else:
            weights = cj_token_weights(step, k, mode="step_token_mean")
        return Trajectory(plan=plan, weights=weights)

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: Trajectory, iteration: int) -> torch.Tensor:
        lp = plan_logp(scorer, batch, data.plan)
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
    replays_trajectory = True

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

    def sampling(self, sampling: SamplingConfig) -> SamplingConfig:
        return with_fields(sampling, record_steps=True, record_trajectory=True)

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


@dataclass
class TreeRolloutBatch(RolloutBatch):
    """The leaves of a tree rollout, with each leaf's path.

    Attributes:
        tree_nodes: [B, depth] node ids from the first level (a child of the all-mask root) to the leaf.
        tree_canvas: [B, depth, R] the response canvas of each node of the path.
    """

    tree_nodes: torch.Tensor | None = None
    tree_canvas: torch.Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class DTreeRPO(RLAlgorithm[TrainingRows]):
    """d-TreeRPO (Pan et al., arXiv 2512.09675): tree rollouts with sibling-local advantages.

    Each prompt's group is one tree (`trees * branching ** (depth - 1)` leaves = the group size):
    the root is the prompt with an all-mask response; its `trees` children decode the first
    `T / depth` of the T rollout steps, and every node below branches into `branching` children
    that decode the next `T / depth`. Node value = mean of its children's (leaf: the reward);
    advantage = value - mean of its siblings'; one row per non-root node scores the tokens it
    revealed from its parent's canvas (the all-mask response for the first level), so every
    decoded token is in a trained segment; clipped loss (eps 0.4) + k3 KL to the reference.
    Self-distillation is not included (DARE's term is 0 at its recipe: docs/algorithms.md#d-treerpo).

    The update is DARE's (docs/algorithms.md#d-treerpo): the rows in node-major order (node by
    node, each node's row for every prompt), dealt to `row_shards` contiguous shards as verl
    deals them to its data-parallel GPUs; each optimizer step takes the next `prompts / row_shards`
    rows of every shard (as many rows in all as the rank has prompts: verl's `ppo_mini_batch_size`
    = the prompts per step with `rollout.n = 1`), and `num_iterations` epochs repeat the same
    order (no shuffle): 20 steps per epoch at the recipe's tree, 240 per rollout batch.

    Attributes:
        trees: children of the all-mask root per prompt (DARE `num_tree_samples`).
        branching: children per node below the first level (DARE `tree_branch_factor`).
        depth: levels of decoded nodes (DARE `tree_contraction_factor`, branch points at
            `k T // depth`); rl.group_size must be trees * branching ** (depth - 1).
        clip: symmetric clip range of the ratio (no dual clip).
        kl_coef: weight of the k3 KL to the frozen reference (0: no reference model).
        num_iterations: epochs over the segment rows per rollout batch (DARE `ppo_epochs`).
        mini_batches: one optimizer step per mini-batch of as many rows as prompts (DARE's);
            false: one optimizer step per epoch on all rows.
        row_shards: the data-parallel GPUs DARE deals the rows to (8 in its recipe); each rank's
            prompts must be a multiple of it (1: plain node-major mini-batches).
    """

    trees: int = 4
    branching: int = 4
    depth: int = 2
    clip: float = 0.4
    kl_coef: float = 0.01
    num_iterations: int = 12
    mini_batches: bool = True
    row_shards: int = 8
    families: ClassVar[tuple[str, ...]] = MASKED
    row_local = True
    chunkable_rollout = False
    values_vary_by_iteration = False

    def __post_init__(self) -> None:
        for name in ("trees", "branching", "depth", "num_iterations", "row_shards"):
            if getattr(self, name) < 1:
                raise ValueError(f"algorithm.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def mini_batch_rows(self) -> MiniBatchRows:
        return "prompts" if self.mini_batches else "all"

    @property
    def group_size(self) -> int:
        """Leaves per prompt: trees * branching ** (depth - 1)."""
        return self.trees * int(self.branching ** (self.depth - 1))

    def num_rows(self, data: TrainingRows) -> int:
        return int(data.noisy.shape[0])

    def select_rows(self, data: TrainingRows, rows: slice) -> TrainingRows:
        return data.select(rows)

    def branch_steps(self, steps: int) -> list[int]:
        """The global steps at which nodes end and branch: `k * steps // depth`, k = 1 .. depth - 1."""
        out = [k * steps // self.depth for k in range(1, self.depth)]
        if sorted(set([0, *out, steps])) != [0, *out, steps]:
            raise ValueError(f"d-TreeRPO: {steps} rollout steps cannot hold {self.depth} levels; "
                             "raise rollout.steps or lower algorithm.depth")
        return out

    def _check_prompts(self, prompts: int) -> None:
        if self.mini_batches and prompts % self.row_shards:
            raise ValueError(
                f"d-TreeRPO: algorithm.row_shards={self.row_shards} deals each rank's segment rows to "
                f"{self.row_shards} shards as DARE's GPUs, so the rank's prompts ({prompts}) must be a multiple "
                f"of it: set rl.prompts_per_step to a multiple of {self.row_shards} x the data-parallel ranks, "
                "or algorithm.row_shards to a divisor of the rank's prompts (1: plain node-major mini-batches)")

    def generate(self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
                 sampling: SamplingConfig, ref_model: Any) -> RolloutBatch:
        g = self.group_size
        if prompt_ids.shape[0] % g:
            raise ValueError(f"d-TreeRPO: rl.group_size must be trees * branching ** (depth - 1) = {g}, "
                             f"got a batch of {prompt_ids.shape[0]} rows")
        self._check_prompts(prompt_ids.shape[0] // g)
        prompts = [row[m].tolist() for row, m in zip(prompt_ids[::g], prompt_mask[::g])]
        tree = tree_generate(model, prompts, sampling, branch_steps=self.branch_steps(sampling.steps),
                             branching=self.branching, roots=self.trees, seed=int(seeds[0]))
        path = [tree.leaf_node]
        while True:
            up = tree.node_parent[path[0]]
            if bool((up < 0).all()):
                break
            path.insert(0, up)
        nodes = torch.stack(path, 1)  # [B, depth], first level first
        leaves = tree.leaves
        fields = {f: getattr(leaves, f) for f in leaves.__dataclass_fields__}
        return TreeRolloutBatch(**fields, tree_nodes=nodes, tree_canvas=tree.node_response[nodes])

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> TrainingRows:
        r = batch.rollout
        if not isinstance(r, TreeRolloutBatch) or r.tree_nodes is None or r.tree_canvas is None:
            raise ValueError("d-TreeRPO trains on its own tree rollouts (DTreeRPO.generate)")
        nodes, canvas = r.tree_nodes, r.tree_canvas
        g, levels = self.group_size, nodes.shape[1]
        prompts = nodes.shape[0] // g
        if int(torch.unique(batch.group_ids).numel()) != prompts:
            raise ValueError(f"d-TreeRPO: rl.group_size must be trees * branching ** (depth - 1) = {g} "
                             f"(one tree per prompt), got {nodes.shape[0]} rows of "
                             f"{int(torch.unique(batch.group_ids).numel())} prompts")
        self._check_prompts(prompts)
        seen: dict[int, tuple[int, int, int, int]] = {}  # node -> (level, index in its prompt's level, prompt, row)
        for i, row in enumerate(nodes.tolist()):
            for d, n in enumerate(row):
                seen.setdefault(n, (d, (i % g) // self.branching ** (levels - 1 - d), i // g, i))
        index = {n: j for j, n in enumerate(sorted(seen))}
        # the all-mask root of prompt q is node len(seen) + q: the first level are siblings under it
        parent = torch.full((len(seen) + prompts,), -1)
        for i, row in enumerate(nodes.tolist()):
            parent[index[row[0]]] = len(seen) + i // g
            for d in range(1, levels):
                parent[index[row[d]]] = index[row[d - 1]]
        leaf_reward = torch.full((len(seen) + prompts,), float("nan"))
        leaf_reward[[index[n] for n in nodes[:, -1].tolist()]] = batch.scores.cpu().float()
        adv = tree_local_advantages(parent, tree_values(parent, leaf_reward))
        # DARE's node-major order: level, then the node's index within its prompt's level, then the prompt
        segs = sorted(seen, key=lambda n: seen[n][:3])
        segs = [segs[i] for i in self.step_order(len(segs), prompts)]
        rows = torch.tensor([seen[n][3] for n in segs], device=canvas.device)
        level = torch.tensor([seen[n][0] for n in segs], device=canvas.device)
        child = canvas[rows, level]
        par = torch.where(level[:, None] > 0, canvas[rows, (level - 1).clamp_min(0)], batch.tokens.mask_id)
        noisy, attn = _rows(r.prompt_ids[rows], r.prompt_mask[rows], par)
        clean, _ = _rows(r.prompt_ids[rows], r.prompt_mask[rows], child)
        t = batch.tokens
        return TrainingRows(noisy=noisy, clean=clean, attention=attn,
                            advantages=adv[[index[n] for n in segs]].to(noisy.device),
                            active=tree_active_positions(par, child, t.mask_id, t.eos_id))

    def step_order(self, rows: int, prompts: int) -> list[int]:
        """Node-major row indices in the order of the optimizer steps (DARE's dealing, see the class doc).

        Args:
            rows: segment rows (nodes per prompt x prompts), in node-major order.
            prompts: the rank's prompts (rows per optimizer step).

        Returns:
            a permutation of range(rows): step j's rows are positions [j * prompts, (j + 1) * prompts).
        """
        if not self.mini_batches:
            return list(range(rows))
        shard, per = rows // self.row_shards, prompts // self.row_shards
        return [s * shard + j + k for j in range(0, shard, per) for s in range(self.row_shards) for k in range(per)]

    def values(self, scorer: ValuesScorer, batch: RLBatch, data: TrainingRows, iteration: int) -> torch.Tensor:
        return _score_rows(scorer, batch, data)

    def loss(self, values: torch.Tensor, inputs: LossInputs[TrainingRows]) -> tuple[torch.Tensor, Metrics]:
        d = inputs.data
        assert inputs.old is not None
        return tree_policy_loss(values, inputs.old, d.advantages, d.active, clip=self.clip, ref_logp=inputs.ref,
                                kl_coef=self.kl_coef if inputs.ref is not None else 0.0)


__all__ = ["CJGRPO", "DTreeRPO", "MDPO", "Trajectory", "TrainingRows", "TreeRolloutBatch", "trajectory_steps"]
