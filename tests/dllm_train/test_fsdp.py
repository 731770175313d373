"""FSDP2 on 2 gloo ranks, each on half the batch, updates exactly like one process on all of it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.dllm_train.distributed_helpers import run_ranks


def _update_both_ways(rank: int) -> dict[str, Any]:
    from dare.algorithms import build_objective
    from dare.quickstart import build_tiny_model
    from dare.tasks.addition import build_tokenizer
    from dllm_rollout import RolloutBatch
    from dllm_train import ActorWorker, Experience
    from dllm_train.distributed import full_state_dict, select_rows, shard_model, shard_rows
    from tests.dllm_train.helpers import tiny_config

    cfg = tiny_config("model.n_layers=2")
    model = build_tiny_model(cfg, build_tokenizer())
    objective = build_objective(cfg.algorithm, cfg.rl)
    g = torch.Generator().manual_seed(0)
    b, p, r = 4, 5, 6
    # full prompt and response masks: every rank counts the same number of tokens, so the
    # token-mean loss averaged over ranks equals the token-mean over the whole batch
    rollout = RolloutBatch(prompt_ids=torch.randint(0, 10, (b, p), generator=g),
                           prompt_mask=torch.ones(b, p, dtype=torch.bool),
                           response_ids=torch.randint(0, 10, (b, r), generator=g),
                           response_mask=torch.ones(b, r, dtype=torch.bool), seeds=torch.zeros(b, dtype=torch.long))
    adv = torch.randn(b, generator=g)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    local = copy.deepcopy(model)
    local_actor = ActorWorker(local, objective, cfg.rl_optim)
    full_exp = Experience(rollout=rollout, scores=adv, group_ids=torch.tensor([0, 0, 1, 1]))
    local_actor.prepare(full_exp, g)  # the plan and old values of the whole batch
    full_exp.advantages = adv
    rows = torch.arange(b)[shard_rows(b, 2, rank)]
    rank_exp = select_rows(copy.deepcopy(full_exp), rows, b)
    # the second step is off-policy (ratio != 1) and uses Adam state
    local_metrics = [local_actor.update(full_exp) for _ in range(2)]

    sharded = shard_model(model)
    actor = ActorWorker(sharded, objective, cfg.rl_optim)
    dist_metrics = [actor.update(rank_exp) for _ in range(2)]
    full = full_state_dict(sharded)
    ref = local.state_dict()
    diff = max(float((full[k] - ref[k]).abs().max()) for k in ref)
    moved = max(float((ref[k] - init[k]).abs().max()) for k in ref)
    return {"diff": diff, "local": local_metrics, "dist": dist_metrics, "keys": sorted(full) == sorted(ref),
            "moved": moved}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_update_both_ways)


def test_fsdp2_two_ranks_match_single_process_update(results: list[dict[str, Any]]) -> None:
    for res in results:
        assert res["keys"]
        assert res["moved"] > 1e-4  # the update did change the weights
        assert res["diff"] < 1e-6, res["diff"]


def test_fsdp2_grad_norm_is_global(results: list[dict[str, Any]]) -> None:
    # clip_grad_norm_ over DTensors reduces across ranks: every rank reports the full-batch norm
    for res in results:
        for loc, dis in zip(res["local"], res["dist"]):
            assert dis["grad_norm"] == pytest.approx(loc["grad_norm"], rel=1e-5)
            assert dis["skipped"] == 0.0


def test_uneven_split_is_rejected_before_any_actor_starts() -> None:
    from dllm_train.distributed import DistributedConfig, shard_rows

    with pytest.raises(ValueError, match="divisible by the number of workers"):
        shard_rows(6, 4, 0)
    with pytest.raises(ValueError, match="num_workers"):
        DistributedConfig(num_workers=0)
