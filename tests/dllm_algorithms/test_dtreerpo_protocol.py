"""d-TreeRPO as DARE runs it (yjyddq/DARE at 83ae8a3): the tree, the segment rows, the update
protocol and the optimizer, each compared in float64 with a transcription of DARE's code:

- the tree: `verl/workers/rollout/dtreerpo_llada_rollout.py:83-147` (levels) and `:220-342`
  (partial decoding), `verl/workers/rollout/generate.py:21-41` (noise, quota);
- the segments: `verl/trainer/ppo/dtreerpo_algos.py:116-196`, the active positions of
  `verl/workers/actor/llada_dp_actor_dtreerpo.py:120-147,255-260`;
- the update: verl's data-parallel dispatch (`DP_COMPUTE_PROTO` deals contiguous chunks to the
  GPUs), `verl/workers/fsdp_workers.py:150-151` (`ppo_mini_batch_size * rollout.n // GPUs` rows per
  GPU and step), `llada_dp_actor_dtreerpo.py:217-324` (no shuffle: `batch.split`, `ppo_epochs`
  passes), and the recipe `recipe/llada/run_dtreerpo_llada_8b_instruct.sh:105-106,152-153,158,167-168`.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import dllm_algorithms as da
from dllm_rollout import SamplingConfig, tree_generate
from dllm_train import (LocalRL, LossInputs, OptimConfig, RLBatch, SpecialTokens, TrainerConfig, mini_batch_slices,
                        sample_seeds)
from tests.tiny_rl import TOK, addition_prompts, text_reward, tiny_model

# --- DARE's tree, transcribed (temperature 0: `add_gumbel_noise` returns the logits, generate.py:23-24) ---


def _dare_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    # DARE: verl/workers/rollout/generate.py:31-41
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num_transfer_tokens = base.expand(-1, steps).clone()
    if remainder.sum() > 0:
        indices = torch.arange(steps)
        num_transfer_tokens[indices.unsqueeze(0) < remainder] += 1
    return num_transfer_tokens.to(torch.int64)


def _dare_partial(model: Any, start_generation: torch.Tensor, prompt_length: int, response_length: int,
                  block_length: int, current_step: int, steps_to_run: int, total: int, mask_id: int) -> torch.Tensor:
    # DARE: verl/workers/rollout/dtreerpo_llada_rollout.py:226-342 (no padding, cfg_scale 0, low_confidence)
    x = start_generation.clone()
    num_blocks = response_length // block_length
    steps_per_block = total // num_blocks
    target_step = max(0, current_step - steps_to_run)
    current_block_idx = (total - current_step) // steps_per_block
    target_block_idx = (total - target_step) // steps_per_block
    prompt_index = torch.zeros_like(x, dtype=torch.bool)
    prompt_index[:, :prompt_length] = True
    remaining_steps = steps_to_run
    for block_idx in range(current_block_idx, min(target_block_idx + 1, num_blocks)):
        if remaining_steps <= 0:
            break
        start_idx = prompt_length + block_idx * block_length
        end_idx = prompt_length + (block_idx + 1) * block_length
        block_step_start = total - block_idx * steps_per_block
        block_step_end = total - (block_idx + 1) * steps_per_block
        steps_needed = max(0, min(current_step, block_step_start) - max(target_step, block_step_end))
        if steps_needed <= 0:
            continue
        done_in_block = max(0, min(block_step_start - current_step, steps_per_block))
        remain_in_block = steps_per_block - done_in_block
        if remain_in_block <= 0:
            continue
        steps_in_this_block = min(steps_needed, remaining_steps, remain_in_block)
        if steps_in_this_block <= 0:
            continue
        schedule = _dare_num_transfer_tokens(x[:, start_idx:end_idx] == mask_id, remain_in_block)
        for step_i in range(steps_in_this_block):
            block_mask_step = x[:, start_idx:end_idx] == mask_id
            budget = schedule[:, step_i]
            mask_index_full = x == mask_id
            full_logits = model(x).logits
            x0 = torch.argmax(full_logits, dim=-1)
            p = torch.softmax(full_logits.float(), dim=-1)
            x0_p = torch.gather(p, dim=-1, index=x0.unsqueeze(-1)).squeeze(-1)
            x0_p[:, :start_idx] = -float("inf")
            x0_p[:, end_idx:] = -float("inf")
            x0 = torch.where(mask_index_full, x0, x)
            confidence = torch.where(mask_index_full, x0_p, -torch.inf)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for b in range(x.size(0)):
                k = min(int(budget[b].item()), int(block_mask_step[b].sum().item()))
                if k <= 0:
                    continue
                _, candidate_idx = torch.topk(confidence[b], k=k)
                transfer_index[b, candidate_idx] = True
            transfer_index = transfer_index & ~prompt_index
            x[transfer_index] = x0[transfer_index]
        remaining_steps -= steps_in_this_block
    return x


def _dare_tree(model: Any, input_ids: torch.Tensor, *, total_steps: int, response_length: int, block_length: int,
               s: int, branch: int, samples: int, mask_id: int) -> dict[str, dict[str, Any]]:
    """DTreeRPORollout.generate_sequences' tree: every node, in creation order (a dict keeps it)."""
    # DARE: verl/workers/rollout/dtreerpo_llada_rollout.py:83-147
    branch_points = [total_steps] + [total_steps - int(k * total_steps / s) for k in range(1, s + 1)]
    branch_points = sorted(list(set(branch_points)), reverse=True)
    prompt_length = input_ids.size(1)
    initial_gen = torch.full((input_ids.size(0), prompt_length + response_length), mask_id, dtype=torch.long)
    initial_gen[:, :prompt_length] = input_ids
    all_nodes: dict[str, dict[str, Any]] = {
        "root": {"id": "root", "parent_id": None, "generation": initial_gen, "step": total_steps, "children": []}}
    current_level = [all_nodes["root"]]
    for i in range(len(branch_points) - 1):
        start_step, end_step = branch_points[i], branch_points[i + 1]
        next_level = []
        for node in current_level:
            bf = samples if node["id"] == "root" else branch
            for _ in range(bf):
                new_gen = _dare_partial(model, node["generation"], prompt_length, response_length, block_length,
                                        start_step, start_step - end_step, total_steps, mask_id)
                child_id = f"n{len(all_nodes)}"  # DARE: uuid4; only the insertion order matters
                child = {"id": child_id, "parent_id": node["id"], "generation": new_gen, "step": end_step,
                         "children": []}
                all_nodes[child_id] = child
                node["children"].append(child_id)
                next_level.append(child)
        current_level = next_level
    return all_nodes


def _level_of(nodes: dict[str, dict[str, Any]], nid: str) -> int:
    d = 0
    while nodes[nid]["parent_id"] is not None:
        nid, d = nodes[nid]["parent_id"], d + 1
    return d


@pytest.mark.parametrize(("response", "block", "steps", "s"), [
    (16, 8, 8, 2),   # the split at T/2 = 4 lands on a block boundary (the recipe: 256, 32, 128, 2)
    (16, 16, 8, 2),  # ... inside a block: DARE recomputes that block's quota for its remaining steps
    (10, 10, 4, 2),  # an uneven quota (3, 3, 2, 2) split after two steps
    (12, 12, 12, 3), # three levels: branch points 8 and 4 steps from the end
])
def test_tree_equals_dare(response: int, block: int, steps: int, s: int) -> None:
    from tests.dllm_models.tiny_configs import build_tiny

    model = build_tiny("llada").double().eval()
    mask = model.traits.mask_token_id
    prompts = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    trees, branch = 2, 3
    with torch.no_grad():
        dare = _dare_tree(model, prompts, total_steps=steps, response_length=response, block_length=block, s=s,
                          branch=branch, samples=trees, mask_id=mask)
    assert all(not bool((n["generation"] == mask).any()) for n in dare.values() if n["step"] == 0)  # no mask proposed
    cfg = SamplingConfig(max_new_tokens=response, steps=steps, block_length=block, temperature=0.0)
    alg = da.DTreeRPO(trees=trees, branching=branch, depth=s)
    ours = tree_generate(model, prompts.tolist(), cfg, branch_steps=alg.branch_steps(steps), branching=branch,
                         roots=trees, seed=0)
    # our nodes: level by level, prompt-major within a level; DARE's: level by level, node-major (one tensor
    # holds every prompt's canvas of a node)
    dare_nodes = [n for n in dare.values() if n["parent_id"] is not None]
    levels = [_level_of(dare, n["id"]) for n in dare_nodes]
    assert len(dare_nodes) == ours.node_response.shape[0] // 2
    for level in range(1, s + 1):
        at = [n for n, lv in zip(dare_nodes, levels) if lv == level]
        first = sum(levels.count(lv) for lv in range(1, level)) * 2
        for j, node in enumerate(at):
            for b in range(2):
                mine = first + b * len(at) + j
                assert torch.equal(ours.node_response[mine], node["generation"][b, 5:]), (level, j, b)
                assert int(ours.node_step[mine]) == steps - node["step"]  # DARE counts steps left
                if level == 1:
                    assert node["parent_id"] == "root" and int(ours.node_parent[mine]) == -1
                else:
                    prev = [n["id"] for n, lv in zip(dare_nodes, levels) if lv == level - 1]
                    assert prev.index(node["parent_id"]) == j // branch  # DARE: children follow their parent
                    assert int(ours.node_parent[mine]) == first - 2 * len(prev) + b * len(prev) + j // branch
    # every decoded token is in a trained segment: the first level starts from the all-mask response
    assert not bool((ours.node_response[: 2 * trees] == mask).all(-1).any())


# --- DARE's segments and its update protocol, transcribed ---


def _dare_segments(node_gens: list[torch.Tensor], parent_idx: list[int], leaf_rewards_mat: torch.Tensor,
                   is_leaf: list[bool], node_steps: list[int], branch_points: list[int]) -> dict[str, torch.Tensor]:
    """compute_dtreerpo_rewards_and_segments after the reward: values, local advantages, segment rows."""
    # DARE: verl/trainer/ppo/dtreerpo_algos.py:116-196 (node_generations: [num_nodes, B, seq_len])
    num_nodes, batch_size = len(node_gens), node_gens[0].size(0)
    children = [[c for c in range(num_nodes) if parent_idx[c] == i] for i in range(num_nodes)]
    node_value_vecs = torch.zeros(num_nodes, batch_size)
    leaf_idx = 0
    for i in range(num_nodes):
        if is_leaf[i]:
            node_value_vecs[i] = leaf_rewards_mat[leaf_idx]
            leaf_idx += 1
    for step in sorted(branch_points[:-1]):
        for i in range(num_nodes):
            if node_steps[i] == step and i > 0 and children[i]:
                node_value_vecs[i] = torch.nanmean(torch.stack([node_value_vecs[c] for c in children[i]]), dim=0)
    node_value_vecs[0] = torch.nanmean(torch.stack([node_value_vecs[c] for c in children[0]]), dim=0)
    node_local_adv = torch.zeros(num_nodes, batch_size)
    for i in range(1, num_nodes):
        sibs = [c for c in children[parent_idx[i]] if c != i]
        sib_mean = (torch.nanmean(torch.stack([node_value_vecs[c] for c in sibs]), dim=0) if sibs
                    else torch.zeros(batch_size))
        node_local_adv[i] = node_value_vecs[i] - sib_mean
    parents, childs, advs, gids, keys = [], [], [], [], {}  # type: ignore[var-annotated]
    for i in range(1, num_nodes):
        for b in range(batch_size):
            gids.append(keys.setdefault((parent_idx[i], b), len(keys)))
        parents.append(node_gens[parent_idx[i]])
        childs.append(node_gens[i])
        advs.append(node_local_adv[i])
    return {"parent_ids": torch.cat(parents), "child_ids": torch.cat(childs), "local_advantages": torch.cat(advs),
            "group_ids": torch.tensor(gids)}


def _dare_active(parent_ids: torch.Tensor, child_ids: torch.Tensor, prompt_length: int, mask_id: int,
                 eos_id: int) -> torch.Tensor:
    """The active positions: changed (parent MASK, child not) and the completion mask through the first EOS."""
    comp_parent, comp_child = parent_ids[:, prompt_length:], child_ids[:, prompt_length:]
    changed = (comp_parent == mask_id) & (comp_child != mask_id)  # DARE: llada_dp_actor_dtreerpo.py:121
    is_unmasked = (comp_child != mask_id).float()  # DARE: llada_dp_actor_dtreerpo.py:132-147 (pad id = EOS)
    is_eos = comp_child == eos_id
    b, length = is_eos.size()
    eos_idx = torch.full((b,), length, dtype=torch.long)
    has_eos = is_eos.any(dim=1)
    eos_idx[has_eos] = is_eos[has_eos].int().argmax(dim=1)
    seq_idx = torch.arange(length).unsqueeze(0).expand(b, length)
    completion_mask = is_unmasked * (seq_idx <= eos_idx.unsqueeze(1)).float()
    return (completion_mask * changed.float()) > 0  # x (new_local_logps != 0): never 0 in float64 here


def _dare_step_rows(num_rows: int, gpus: int, ppo_mini_batch_size: int, rollout_n: int, epochs: int) -> list[list[int]]:
    """The global rows of every optimizer step: each GPU's contiguous chunk, cut by batch.split, no shuffle."""
    per_gpu_mini = ppo_mini_batch_size * rollout_n // gpus  # DARE: verl/workers/fsdp_workers.py:150-151
    assert per_gpu_mini > 0 and num_rows % gpus == 0  # fsdp_workers.py:152; DataProto.chunk needs equal chunks
    chunk = num_rows // gpus  # DP_COMPUTE_PROTO: GPU g holds rows [g * chunk, (g + 1) * chunk)
    splits = [[list(range(g * chunk + a, min(g * chunk + a + per_gpu_mini, (g + 1) * chunk)))
               for a in range(0, chunk, per_gpu_mini)] for g in range(gpus)]  # llada_dp_actor_dtreerpo.py:217
    steps = []
    for _epoch in range(epochs):  # llada_dp_actor_dtreerpo.py:220-221: the same order every epoch
        for batch_idx in range(len(splits[0])):
            steps.append([r for g in range(gpus) for r in splits[g][batch_idx]])  # one all-reduced optimizer step
    return steps


@dataclass
class _Rollout:
    batch_size: int


@dataclass
class _Batch:
    rollout: _Rollout
    group_ids: torch.Tensor


@dataclass
class _Rows:
    noisy: torch.Tensor


def _our_step_rows(alg: da.DTreeRPO, num_rows: int, prompts: int) -> list[list[int]]:
    """Our optimizer steps as node-major row indices: `step_order`, cut by the trainer's mini-batches."""
    order = alg.step_order(num_rows, prompts)
    batch = _Batch(_Rollout(prompts * alg.group_size), torch.arange(prompts).repeat_interleave(alg.group_size))
    slices = mini_batch_slices(alg, batch, _Rows(torch.zeros(num_rows, 1)))  # type: ignore[arg-type]
    return [order[s] for _ in range(alg.num_iterations) for s in slices]


def test_recipe_update_protocol_equals_dare() -> None:
    # the recipe: 16 prompts, rollout.n 1, 8 GPUs, ppo_mini_batch_size 16, 12 epochs; 4 + 16 nodes per prompt
    alg = da.DTreeRPO()
    nodes, prompts = alg.trees * (1 + alg.branching), 16
    dare = _dare_step_rows(nodes * prompts, gpus=8, ppo_mini_batch_size=prompts, rollout_n=1, epochs=12)
    ours = _our_step_rows(alg, nodes * prompts, prompts)
    assert len(dare) == len(ours) == 240
    assert [sorted(s) for s in ours] == [sorted(s) for s in dare]
    assert ours == dare  # the same order within a step too (GPU-major)


@pytest.mark.parametrize(("prompts", "shards"), [(8, 8), (32, 8), (4, 2), (6, 1)])
def test_update_protocol_equals_dare_at_other_shapes(prompts: int, shards: int) -> None:
    alg = da.DTreeRPO(trees=2, branching=3, depth=2, num_iterations=3, row_shards=shards)
    nodes = 2 + 2 * 3
    assert _our_step_rows(alg, nodes * prompts, prompts) == _dare_step_rows(
        nodes * prompts, gpus=shards, ppo_mini_batch_size=prompts, rollout_n=1, epochs=3)


def test_dare_self_distillation_is_zero_at_the_recipe() -> None:
    # DARE forms sibling groups inside a micro-batch (llada_dp_actor_dtreerpo.py:285-302) and skips every
    # group with one member (:400-403), returning 0 when none is left (:439-441). At the recipe a GPU's
    # mini-batch (and so each of its micro-batches) holds 2 rows of one node for 2 prompts: distinct groups.
    alg = da.DTreeRPO()
    prompts, nodes = 16, alg.trees * (1 + alg.branching)
    parent_idx = [-1] + [0] * alg.trees + [1 + t for t in range(alg.trees) for _ in range(alg.branching)]
    gens = [torch.zeros(prompts, 1, dtype=torch.long)] * (nodes + 1)
    segs = _dare_segments(gens, parent_idx, torch.zeros(alg.trees * alg.branching, prompts),
                          [i > alg.trees for i in range(nodes + 1)], [128] + [64] * alg.trees + [0] * 16, [128, 64, 0])
    chunk = nodes * prompts // 8
    for g in range(8):
        for a in range(0, chunk, 2):
            rows = segs["group_ids"][g * chunk + a: g * chunk + a + 2]
            assert rows.unique().numel() == rows.numel()  # every group has one member: no consistency term


def _batch(alg: da.DTreeRPO, model: Any, prompts: int, sampling: SamplingConfig,
           seed: int = 0) -> tuple[RLBatch, list[str]]:
    ids, answers, groups = addition_prompts(prompts, alg.group_size, seed)(0).expanded()
    p = torch.tensor(ids)
    rollout = alg.generate(model, p, torch.ones_like(p, dtype=torch.bool), sample_seeds(seed, len(ids), "rollout", 0),
                           sampling, None)
    scores = torch.tensor([text_reward(TOK.decode(r.tolist()), a) for r, a in zip(rollout.response_ids, answers)])
    tokens = SpecialTokens(mask_id=TOK.mask_token_id, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id)
    return RLBatch(rollout=rollout, scores=scores, group_ids=groups, tokens=tokens), answers


def _dare_inputs(alg: da.DTreeRPO, batch: RLBatch) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """DARE's segment rows (node-major) built from our tree's node canvases, and DARE's step rows."""
    r = batch.rollout
    assert isinstance(r, da.TreeRolloutBatch) and r.tree_canvas is not None
    g, prompts = alg.group_size, r.batch_size // alg.group_size
    prompt = r.prompt_ids[::g]
    root = torch.cat([prompt, torch.full((prompts, r.response_ids.shape[1]), batch.tokens.mask_id)], 1)
    gens, parent_idx, steps = [root], [-1], [2]
    for t in range(alg.trees):  # DARE creates the root's children, then each one's children in turn
        gens.append(torch.cat([prompt, r.tree_canvas[t * alg.branching::g, 0]], 1))
        parent_idx.append(0)
        steps.append(1)
    for t in range(alg.trees):
        for c in range(alg.branching):
            gens.append(torch.cat([prompt, r.tree_canvas[t * alg.branching + c::g, 1]], 1))
            parent_idx.append(1 + t)
            steps.append(0)
    leaf_rewards_mat = batch.scores.reshape(prompts, g).T  # [num_leaves, B], leaf-major as dtreerpo_algos.py:114
    segs = _dare_segments(gens, parent_idx, leaf_rewards_mat, [s == 0 for s in steps], steps, [2, 1, 0])
    segs["active"] = _dare_active(segs["parent_ids"], segs["child_ids"], prompt.shape[1], batch.tokens.mask_id,
                                  batch.tokens.eos_id)
    step_rows = _dare_step_rows(segs["parent_ids"].shape[0], gpus=alg.row_shards, ppo_mini_batch_size=prompts,
                                rollout_n=1, epochs=alg.num_iterations)
    return segs, step_rows


SAMPLING = SamplingConfig(max_new_tokens=4, steps=2, block_length=4, temperature=1.0)


@pytest.mark.parametrize("mini_batches", [True, False])
def test_segment_rows_equal_dare(mini_batches: bool) -> None:
    model = tiny_model("llada", dtype=torch.float64)
    alg = da.DTreeRPO(trees=2, branching=2, depth=2, row_shards=2, mini_batches=mini_batches, num_iterations=1)
    batch, _ = _batch(alg, model, 4, SAMPLING)
    data = alg.prepare(batch, torch.Generator())
    segs, step_rows = _dare_inputs(alg, batch)
    order = [r for s in step_rows for r in s] if mini_batches else list(range(segs["parent_ids"].shape[0]))
    p = batch.rollout.prompt_ids.shape[1]
    assert torch.equal(data.noisy, segs["parent_ids"][order])
    assert torch.equal(data.clean, segs["child_ids"][order])
    assert torch.equal(data.advantages, segs["local_advantages"][order])
    assert torch.equal(data.active, segs["active"][order])
    assert bool(data.advantages.ne(0).any()) and bool(data.active.any())
    # every decoded token is in a trained segment: each leaf's response positions are revealed by
    # exactly one segment of its path (DARE's node-major rows: level 0 (t, b) at t * 4 + b, level 1
    # (t, c, b) at 8 + (2t + c) * 4 + b)
    at = {row: k for k, row in enumerate(order)}
    revealed = (data.noisy[:, p:] == TOK.mask_token_id) & (data.clean[:, p:] != TOK.mask_token_id)
    for b in range(4):
        for t in range(2):
            for c in range(2):
                count = revealed[at[t * 4 + b]].int() + revealed[at[8 + (2 * t + c) * 4 + b]].int()
                assert bool((count == 1).all()), (b, t, c)


# --- DARE's update loop on 8 simulated GPUs, transcribed, against our trainer ---


def _dare_local_logps(model: Any, parent_ids: torch.Tensor, child_ids: torch.Tensor, prompt_length: int,
                      mask_id: int) -> torch.Tensor:
    # DARE: llada_dp_actor_dtreerpo.py:79-130 (no padding: the packed rows are the rows)
    logits = model(parent_ids).logits
    comp_logits, comp_child = logits[:, prompt_length:], child_ids[:, prompt_length:]
    changed = (parent_ids[:, prompt_length:] == mask_id) & (comp_child != mask_id)
    per_token_logps = -F.cross_entropy(comp_logits.transpose(1, 2), comp_child, reduction="none")
    return torch.nan_to_num(per_token_logps * changed.float(), nan=0.0, posinf=0.0, neginf=0.0)


def _dare_update(model: Any, ref: Any, segs: dict[str, torch.Tensor], step_rows: list[list[int]], *, gpus: int,
                 per_gpu: int, prompt_length: int, mask_id: int, lr: float) -> list[float]:
    """update_policy on every GPU in lockstep; FSDP averages the GPUs' gradients. Returns each step's mean loss."""
    epsilon, kl_coef = 0.4, 0.01  # recipe: clip_ratio 0.4, kl_loss_coef 0.01 (run_dtreerpo_llada_8b_instruct.sh:163,166)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)  # :151-153
    parent, child, active = segs["parent_ids"], segs["child_ids"], segs["active"].double()
    with torch.no_grad():
        model.eval()
        old = _dare_local_logps(model, parent, child, prompt_length, mask_id)  # compute_dtreerpo_log_prob
        ref_logps = _dare_local_logps(ref, parent, child, prompt_length, mask_id)
    model.train()
    losses = []
    for rows in step_rows:
        optimizer.zero_grad()  # llada_dp_actor_dtreerpo.py:229
        total = 0.0
        for gpu in range(gpus):  # each GPU's mini-batch: one micro-batch (dynamic bsz, 2 rows fit 5120 tokens)
            mb = rows[gpu * per_gpu:(gpu + 1) * per_gpu]
            new = _dare_local_logps(model, parent[mb], child[mb], prompt_length, mask_id)
            m = active[mb]
            l_eff = m.sum(dim=1).clamp_min(1)  # :255-260
            ratio = torch.exp(new - old[mb])  # :262-269
            a = segs["local_advantages"][mb].double().unsqueeze(1)
            ppo_obj = torch.min(ratio * a, torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon) * a)
            policy_loss = -((ppo_obj * m).sum(dim=1) / l_eff).mean()
            delta = ref_logps[mb] - new  # :274-280
            kl_loss = kl_coef * (((torch.exp(delta) - delta - 1.0) * m).sum(dim=1) / l_eff).mean()
            loss = (policy_loss + kl_loss) * (len(mb) / per_gpu)  # :305-306
            (loss / gpus).backward()  # :309, and FSDP's mean over the GPUs' gradients
            total += float(loss.detach()) / gpus
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.2)  # dp_actor.py:233-248, grad_clip 0.2
        optimizer.step()
        losses.append(total)
    return losses


@dataclass(frozen=True, kw_only=True)
class _RecordingTree(da.DTreeRPO):
    records: list[float] = field(default_factory=list)

    def loss(self, values: torch.Tensor, inputs: LossInputs[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = super().loss(values, inputs)
        if not torch.is_grad_enabled():  # the trainer's evaluation of the mini-batch's loss
            self.records.append(float(out[0]))
        return out


def test_update_equals_dare_on_eight_gpus() -> None:
    # the recipe's protocol (8 GPUs, 2 rows per GPU and step, DARE's optimizer) on a smaller tree, 2 epochs
    lr = 1e-2
    model = tiny_model("llada", dtype=torch.float64)
    alg = _RecordingTree(trees=2, branching=2, depth=2, num_iterations=2)
    optim = OptimConfig(lr=lr, betas=(0.9, 0.99), weight_decay=0.1, grad_clip=0.2)
    rl = LocalRL(model, prompts=addition_prompts(16, alg.group_size), sampling=SAMPLING, reward_fn=text_reward,
                 detokenize=TOK.decode, algorithm=alg, optim=optim, trainer=TrainerConfig(max_steps=1, seed=0))
    start = copy.deepcopy(model)
    prompts, answers, groups = addition_prompts(16, alg.group_size)(0).expanded()
    rl.rank.rollout_step(0, prompts, answers, sample_seeds(0, len(prompts), "rollout", 0), groups)
    prepared = rl.rank.prepared
    assert prepared is not None
    metrics = rl.actor.update(prepared, torch.zeros(len(prompts)))
    segs, step_rows = _dare_inputs(alg, prepared.batch)
    dare_model = copy.deepcopy(start)
    dare = _dare_update(dare_model, start, segs, step_rows, gpus=8, per_gpu=2,
                        prompt_length=prepared.batch.rollout.prompt_ids.shape[1], mask_id=TOK.mask_token_id, lr=lr)
    assert metrics["optimizer_steps"] == len(dare) == 2 * 6
    assert alg.records == pytest.approx(dare, rel=1e-5, abs=1e-9)
    assert any(abs(a - b) > 1e-6 for a, b in zip(dare[:6], dare[6:]))  # the second epoch is off-policy
    # equal within float32 rounding (our objectives compute in float32): 5e-8 here, the weights moving by 0.1
    for (name, ours), theirs, before in zip(model.named_parameters(), dare_model.parameters(), start.parameters()):
        moved = float((theirs - before).detach().abs().max())
        assert moved > 1e-3 and float((ours - theirs).detach().abs().max()) <= 1e-5 * moved, name
    # the comparison sees the protocol: the same rows in plain contiguous mini-batches end elsewhere
    other = copy.deepcopy(start)
    _dare_update(other, start, segs, _dare_step_rows(96, gpus=1, ppo_mini_batch_size=16, rollout_n=1, epochs=2),
                 gpus=1, per_gpu=16, prompt_length=prepared.batch.rollout.prompt_ids.shape[1],
                 mask_id=TOK.mask_token_id, lr=lr)
    assert max(float((a - b).detach().abs().max()) for a, b in zip(other.parameters(), dare_model.parameters())) > 1e-3


def test_recipe_takes_240_optimizer_steps_per_rollout_batch() -> None:
    # the recipe's tree (4 x 4 leaves, 20 nodes per prompt), 16 prompts, 12 epochs; short responses keep it fast
    alg = da.DTreeRPO()
    assert (alg.trees, alg.branching, alg.depth, alg.num_iterations, alg.row_shards) == (4, 4, 2, 12, 8)
    model = tiny_model("llada")
    steps = {"n": 0}
    real = torch.optim.AdamW.step

    def counted(self: torch.optim.AdamW, *args: Any, **kwargs: Any) -> Any:
        steps["n"] += 1
        return real(self, *args, **kwargs)

    rl = LocalRL(model, prompts=addition_prompts(16, alg.group_size), sampling=SAMPLING, reward_fn=text_reward,
                 detokenize=TOK.decode, algorithm=alg, optim=OptimConfig(lr=1e-4), trainer=TrainerConfig(max_steps=1, seed=0))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.AdamW, "step", counted)
        metrics = rl.step(0)
    assert metrics["optimizer_steps"] == 240 and steps["n"] == 240 and rl.actor.updates == 240


def test_prompts_must_fill_the_shards() -> None:
    alg = da.DTreeRPO(trees=2, branching=2, depth=2)  # row_shards 8
    with pytest.raises(ValueError, match="algorithm.row_shards=8"):
        _batch(alg, tiny_model("llada"), 4, SAMPLING)
    assert dataclasses.replace(alg, mini_batches=False).mini_batch_rows == "all"


def test_bad_tree_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="algorithm.trees must be >= 1"):
        da.DTreeRPO(trees=0)
    with pytest.raises(ValueError, match="cannot hold 3 levels"):
        da.DTreeRPO(depth=3).branch_steps(2)
    gen = da.DTreeRPO(trees=2, branching=2, depth=2, row_shards=1)
    batch, _ = _batch(gen, tiny_model("llada"), 2, SAMPLING)
    with pytest.raises(ValueError, match="rl.group_size must be trees"):
        da.DTreeRPO(trees=1, branching=2, depth=2, row_shards=1).prepare(batch, torch.Generator())
