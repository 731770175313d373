"""d-TreeRPO: tree rollouts from the all-mask response, sibling-local advantages, and DARE's update
protocol (docs/algorithms.md#d-treerpo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_objectives import tree_active_positions, tree_local_advantages, tree_policy_loss, tree_values
from dllm_rollout import RolloutBatch, SamplingConfig, tree_generate
from dllm_train import LossInputs, MiniBatchRows, RLAlgorithm, RLBatch, ValuesScorer

from dllm_algorithms.families import MASKED
from dllm_algorithms.scoring import Metrics
from dllm_algorithms.trajectory_policy import TrainingRows, _rows, _score_rows


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


__all__ = ["DTreeRPO", "TreeRolloutBatch"]
