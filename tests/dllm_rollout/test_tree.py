"""Tree rollouts: shared trunks or several children of the all-mask root, distinct branches, consistent records."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout import SamplingConfig, generate, tree_generate


def test_tree_shares_trunk_and_branches(tiny_llada: torch.nn.Module) -> None:
    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0)
    tree = tree_generate(tiny_llada, [[1, 2, 3], [4, 5]], cfg, branch_steps=[2], branching=3, seed=0)
    assert tree.leaves.batch_size == 6 and tree.node_response.shape == (8, 8)
    assert tree.node_parent.tolist() == [-1, -1, 0, 0, 0, 1, 1, 1]
    assert tree.node_is_leaf.tolist() == [False, False] + [True] * 6
    mask = tiny_llada.traits.mask_token_id  # type: ignore[union-attr]
    trunk = tree.node_response[0]
    done = trunk != mask
    assert int(done.sum()) == 4  # two steps of a 4-step, 8-token decode: first block complete
    for leaf in range(3):
        assert torch.equal(tree.leaves.response_ids[leaf][done], trunk[done])
    assert tree.leaves.unmask_step is not None and int(tree.leaves.unmask_step.max()) == 3
    assert not bool((tree.leaves.response_ids == mask).any())


def test_tree_without_branches_is_generate(tiny_llada: torch.nn.Module) -> None:
    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=0.0)
    tree = tree_generate(tiny_llada, [[1, 2, 3]], cfg, branch_steps=[], branching=2, seed=4)
    plain = generate(tiny_llada, [[1, 2, 3]], max_new_tokens=8, steps=4, block_length=4)
    assert torch.equal(tree.leaves.response_ids, plain.response_ids)


def test_roots_decode_from_the_all_mask_response(tiny_llada: torch.nn.Module) -> None:
    # 2 children of each prompt's all-mask root decode steps [0, 2); each branches into 2 for [2, 4)
    cfg = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0)
    tree = tree_generate(tiny_llada, [[1, 2, 3], [4, 5]], cfg, branch_steps=[2], branching=2, roots=2, seed=0)
    assert tree.leaves.batch_size == 8 and tree.node_response.shape == (12, 8)
    assert tree.node_parent.tolist() == [-1] * 4 + [0, 0, 1, 1, 2, 2, 3, 3]
    assert tree.node_step.tolist() == [2] * 4 + [4] * 8
    mask = tiny_llada.traits.mask_token_id  # type: ignore[union-attr]
    first = tree.node_response[:4]
    assert ((first != mask).sum(-1) == 4).all()  # the first block, decoded by each root child itself
    assert not torch.equal(first[0], first[1])  # siblings under the root draw their own tokens
    for leaf, node in enumerate(tree.leaf_node.tolist()):
        up = int(tree.node_parent[node])
        assert up == leaf // 2 and torch.equal(tree.leaves.response_ids[leaf][first[up] != mask],
                                               first[up][first[up] != mask])
    with pytest.raises(ValueError, match="roots and branching must be >= 1"):
        tree_generate(tiny_llada, [[1, 2, 3]], cfg, branch_steps=[2], branching=2, roots=0)
