"""Tree rollouts: branch each prompt's response into children at set denoising steps.

The tree search of tree-structured policy training (docs/generation.md#trajectories): the root is
the prompt with an all-mask response; its `roots` children decode from step 0 to the first branch
step (one shared trunk when `roots` is 1); every later node continues its parent's canvas with its
own seed from one branch step to the next; leaves are complete responses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch
from dllm_rollout.config import SamplingConfig
from dllm_rollout.masked import decode_masked
from dllm_rollout.prompts import _mix, left_pad, sample_seeds


@dataclass
class TreeRollout:
    """Nodes of every tree and the leaf batch.

    Nodes are numbered level by level, prompt-major within a level (the children of a node are
    consecutive); the all-mask root of each prompt is implicit (parent -1).

    Attributes:
        leaves: RolloutBatch of the B * roots * branching ** len(branch_steps) leaves (prompt-major).
        node_response: [N, R] response canvas at the end of each node (mask id where undecided).
        node_step: [N] global step at which each node ends.
        node_parent: [N] parent node index (-1 for the first level, children of the all-mask root).
        node_is_leaf: [N] bool.
        leaf_node: [B_leaf] node index of each leaf row.
    """

    leaves: RolloutBatch
    node_response: torch.Tensor
    node_step: torch.Tensor
    node_parent: torch.Tensor
    node_is_leaf: torch.Tensor
    leaf_node: torch.Tensor


@torch.no_grad()
def tree_generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    cfg: SamplingConfig,
    *,
    branch_steps: Sequence[int],
    branching: int,
    roots: int = 1,
    seed: int | None = None,
) -> TreeRollout:
    """Decode `roots` children of each prompt's all-mask response, then branch every node into
    `branching` children at every step in `branch_steps`.

    Args:
        model: a masked-diffusion model (block diffusion is not supported here yet).
        prompts: B lists of token ids.
        cfg: the decoding settings, the same object every decoder takes (`record_trajectory` is
            turned on: the tree is built from the step records; `record_steps` is refused).
        branch_steps: increasing global steps (0 < s < steps) at which every node splits.
        branching: children per split.
        roots: children of the all-mask root (the first level, decoding steps [0, branch_steps[0]);
            1: a single trunk shared by every leaf of the prompt).
        seed: base seed; the first level's rows take `sample_seeds(seed, B * roots)`, the node at
            depth d > 0, index i, seed mix(seed, d * 2**20 + i).

    Returns:
        TreeRollout with B * roots * branching ** len(branch_steps) leaves; each leaf's `forwards`
        counts the steps on its path from the root (its ancestors' included).
    """
    if model.traits.block_length is not None:
        raise ValueError("tree_generate supports masked diffusion only; block diffusion is not implemented")
    if cfg.record_steps:
        raise ValueError("tree_generate records no per-step canvases (a leaf's steps span several nodes); "
                         "set record_steps=False")
    cfg = replace(cfg, record_trajectory=True)
    steps, block_length = cfg.steps, cfg.block_length
    bounds = list(branch_steps)
    if bounds != sorted(set(bounds)) or (bounds and not 0 < bounds[0] <= bounds[-1] < steps):
        raise ValueError(f"branch_steps must be increasing steps in (0, {steps}), got {bounds}")
    if roots < 1 or branching < 1:
        raise ValueError(f"roots and branching must be >= 1, got roots={roots}, branching={branching}")
    if cfg.threshold is not None or cfg.steps_per_block > block_length or steps % cfg.num_blocks:
        raise ValueError("tree_generate needs quota mode (threshold=None) with steps a multiple of the "
                         "number of blocks and steps_per_block <= block_length")
    base = seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item())
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, model.traits.pad_token_id, device)
    copies = torch.arange(len(prompts)).repeat_interleave(roots)
    ids, mask = ids[copies], mask[copies]
    seeds = sample_seeds(base, ids.shape[0])
    response: torch.Tensor | None = None
    node_of_row = torch.arange(ids.shape[0])
    parents: list[int] = []
    ends: list[int] = []
    canvases: list[torch.Tensor] = []
    step_rows: list[torch.Tensor] = []
    logp_rows: list[torch.Tensor] = []
    fwd_rows: list[torch.Tensor] = []
    edges = [0, *bounds, steps]
    out: RolloutBatch | None = None
    for depth, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        if depth:
            rep = torch.arange(ids.shape[0]).repeat_interleave(branching)
            ids, mask, node_of_row = ids[rep], mask[rep], node_of_row[rep]
            assert response is not None
            response = response[rep]
            prev_steps, prev_logp, prev_fwd = step_rows[-1][rep], logp_rows[-1][rep], fwd_rows[-1][rep]
            seeds = torch.tensor([_mix(base, depth * 2**20 + i) for i in range(ids.shape[0])])
        out = decode_masked(model, ids, mask, seeds, cfg, init_response=response, first_step=a, last_step=b)
        assert out.unmask_step is not None and out.step_logp is not None and out.forwards is not None
        if depth:
            old = prev_steps >= 0
            out.unmask_step = torch.where(old, prev_steps, out.unmask_step)
            out.step_logp = torch.where(old, prev_logp, out.step_logp)
            out.forwards = out.forwards + prev_fwd
        response = out.response_ids
        first = len(parents)
        parents.extend(node_of_row.tolist() if depth else [-1] * ids.shape[0])
        ends.extend([b] * ids.shape[0])
        canvases.append(response)
        step_rows.append(out.unmask_step)
        logp_rows.append(out.step_logp)
        fwd_rows.append(out.forwards)
        node_of_row = torch.arange(first, first + ids.shape[0])
    assert out is not None
    n = len(parents)
    is_leaf = torch.zeros(n, dtype=torch.bool)
    is_leaf[node_of_row] = True
    return TreeRollout(
        leaves=out,
        node_response=torch.cat(canvases),
        node_step=torch.tensor(ends),
        node_parent=torch.tensor(parents),
        node_is_leaf=is_leaf,
        leaf_node=node_of_row,
    )
