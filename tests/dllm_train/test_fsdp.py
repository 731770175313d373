"""FSDP2 on 2 gloo ranks, each on half the batch, updates exactly like one process on all of it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.dllm_train.distributed_helpers import run_ranks


def _update_both_ways(rank: int) -> dict[str, Any]:
    import torch.distributed as dist

    from dllm_algorithms import D1
    from dllm_models import build_model
    from dllm_rollout import RolloutBatch
    from dllm_train import ActorWorker, OptimConfig, RLBatch, Scorer, special_tokens
    from dllm_train.distributed import full_state_dict, select_rows, shard_model, shard_rows
    from tests.tiny_rl import TOK

    raw = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 32, "n_layers": 2, "n_heads": 2,
           "n_kv_heads": 2, "mlp_hidden_size": 64, "vocab_size": len(TOK), "embedding_size": len(TOK),
           "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_sequence_length": 64,
           "mask_token_id": TOK.mask_token_id, "eos_token_id": TOK.eos_token_id, "pad_token_id": TOK.pad_token_id,
           "torch_dtype": "float32"}
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)  # type: ignore[operator]
    algorithm, optim = D1(), OptimConfig(lr=1e-3, grad_clip=1.0)
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
    # reuse_old=False: old values from a separate pass, so the second update is off-policy
    local_actor = ActorWorker(local, algorithm, optim, reuse_old=False)
    batch = RLBatch(rollout=rollout, scores=adv, group_ids=torch.tensor([0, 0, 1, 1]), tokens=special_tokens(model))
    prepared = local_actor.prepare(batch, g)  # the plan and old values of the whole batch
    rows = torch.arange(b)[shard_rows(b, 2, rank)]
    rank_prepared = select_rows(prepared, rows, b)
    # the second step is off-policy (ratio != 1) and uses Adam state
    local_metrics = [local_actor.update(prepared, adv) for _ in range(2)]
    out: dict[str, Any] = {"local": local_metrics}
    ref = local.state_dict()
    out["moved"] = max(float((ref[k] - init[k]).abs().max()) for k in ref)

    # every rank's share, on the sharded model: in one forward per pass, and one row per pass
    # (a token budget of one row's width: 2 passes on every rank, the gradients still equal)
    for name, budget in (("whole", 0), ("budget", p + r)):
        sharded = shard_model(copy.deepcopy(model))
        scorer = Scorer(sharded, lockstep_group=dist.group.WORLD)
        actor = ActorWorker(sharded, algorithm, optim, scorer=scorer, max_tokens_per_pass=budget, reuse_old=False)
        metrics = [actor.update(rank_prepared, adv[rows]) for _ in range(2)]
        full = full_state_dict(sharded)
        out[name] = {"metrics": metrics, "keys": sorted(full) == sorted(ref),
                     "diff": max(float((full[k] - ref[k]).abs().max()) for k in ref)}
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_update_both_ways)


@pytest.mark.parametrize("case", ["whole", "budget"])
def test_fsdp2_two_ranks_match_single_process_update(results: list[dict[str, Any]], case: str) -> None:
    for res in results:
        assert res[case]["keys"]
        assert res["moved"] > 1e-4  # the update did change the weights
        # one forward: the same sums as one process; passes of one row: float32 sums in another order
        assert res[case]["diff"] < (1e-6 if case == "whole" else 1e-5), res[case]["diff"]


@pytest.mark.parametrize("case", ["whole", "budget"])
def test_fsdp2_grad_norm_is_global(results: list[dict[str, Any]], case: str) -> None:
    # clip_grad_norm_ over DTensors reduces across ranks: every rank reports the full-batch norm
    for res in results:
        for loc, dis in zip(res["local"], res[case]["metrics"]):
            assert dis["grad_norm"] == pytest.approx(loc["grad_norm"], rel=1e-5)
            assert dis["skipped"] == 0.0
        passes = [m["update_passes"] for m in res[case]["metrics"]]
        assert passes == ([1.0, 1.0] if case == "whole" else [2.0, 2.0]), passes


def test_uneven_split_is_rejected_before_any_actor_starts() -> None:
    from dllm_train import TrainerConfig
    from dllm_train.distributed import shard_rows

    with pytest.raises(ValueError, match="divisible by the number of data-parallel groups 4"):
        shard_rows(6, 4, 0)
    with pytest.raises(ValueError, match="trainer.num_workers"):
        TrainerConfig(backend="ray", num_workers=0)
