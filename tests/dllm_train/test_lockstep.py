"""Lockstep passes under FSDP2: ranks that need different numbers of passes (or use different
experts) still run the same collectives (no deadlock) and get exactly the gradient of the
single-process computation.

Every case runs on 2 gloo ranks whose rows need different numbers of forward/backward passes
(rank 0 more than rank 1). FSDP2 averages the two ranks' gradients, so the expected gradient is
(g_0 + g_1) / 2, where g_r is the gradient of rank r's own loss computed in one process on the
unsharded model.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.dllm_train.distributed_helpers import run_ranks

DIGITS = torch.arange(12)  # the tiny tokenizer's digits, '+' and '=' (no special id)


def _rollout(rank: int, family: str, g: torch.Generator) -> Any:
    """4 hand-made rows per rank: rank 0 commits its 4 response tokens in 4 steps, one per step,
    and counts all of them; rank 1 commits 2 per step (2 steps) and counts only the first 2."""
    from dllm_rollout import RolloutBatch, SamplingConfig

    b, p, r = 4, 3, 4
    steps = 4 if rank == 0 else 2
    unmask = torch.stack([torch.randperm(r, generator=g) * steps // r for _ in range(b)])
    response_mask = torch.ones(b, r, dtype=torch.bool)
    if rank == 1:
        response_mask[:, 2:] = False  # two counted tokens: JustGRPO replays 2 positions, not 4
        unmask = torch.where(response_mask, unmask, -1)
    return RolloutBatch(
        prompt_ids=DIGITS[torch.randint(0, 12, (b, p), generator=g)],
        prompt_mask=torch.ones(b, p, dtype=torch.bool),
        response_ids=DIGITS[torch.randint(0, 12, (b, r), generator=g)],
        response_mask=response_mask, seeds=torch.zeros(b, dtype=torch.long), unmask_step=unmask,
        config=SamplingConfig(max_new_tokens=r, steps=steps, block_length=r, block_diffusion=family == "sdar"),
    )


def _experience(rank: int, family: str, objective: Any) -> Any:
    from dllm_train import Experience

    g = torch.Generator().manual_seed(100 + rank)
    rollout = _rollout(rank, family, g)
    exp = Experience(rollout=rollout, scores=torch.zeros(4), group_ids=torch.tensor([0, 0, 1, 1]),
                     advantages=torch.randn(4, generator=g))
    exp.plan = objective.sample_plan(rollout, g)
    return exp


def _update_grads(model: torch.nn.Module, scorer: Any, objective: Any, exp: Any) -> None:
    """Old values (no grad), then the objective's own update strategy (it runs backward)."""
    with torch.no_grad():
        exp.old_logp = objective.score(scorer, exp)
    objective.update(objective, scorer, exp)


def _full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for n, p in model.named_parameters():
        assert p.grad is not None, n  # every parameter took part in every rank's passes
        out[n] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
    return out


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _algorithm_case(rank: int, family: str, name: str, fields: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from dllm_train import Scorer, lockstep_passes
    from dllm_train.distributed import shard_model
    from tests.dllm_train.algo_helpers import tiny_model
    from tests.dllm_train.distributed_helpers import algorithm_objective

    objective = algorithm_objective(name, fields)
    model = tiny_model(family).train()
    local = copy.deepcopy(model)
    exps = [_experience(r, family, objective) for r in (0, 1)]
    chunk = fields.get("chunk_size", 1)
    needs = [-(-e.plan.num_samples // chunk) for e in exps]  # passes of each rank's update
    for e in exps:  # single process, unsharded: g_0 + g_1
        _update_grads(local, Scorer(local), objective, copy.deepcopy(e))
    expected = {n: p.grad / 2 for n, p in local.named_parameters() if p.grad is not None}

    sharded = shard_model(model)
    scorer = Scorer(sharded, lockstep_group=dist.group.WORLD)
    agreed = lockstep_passes(scorer, needs[rank])
    _update_grads(sharded, scorer, objective, exps[rank])
    return {"needs": needs, "agreed": agreed, "gap": _max_gap(_full_grads(sharded), expected),
            "scale": max(float(v.abs().max()) for v in expected.values())}


def _scorer_case(rank: int) -> dict[str, Any]:
    """A block-family scorer call whose rows hold a noised token on rank 0 and none on rank 1."""
    import torch.distributed as dist

    from dllm_train import Scorer
    from dllm_train.distributed import shard_model
    from tests.dllm_train.algo_helpers import TOK, tiny_model

    model = tiny_model("sdar").train()
    local = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    clean = DIGITS[torch.randint(0, 12, (2, 8), generator=g)]
    attn = torch.ones(2, 8, dtype=torch.bool)
    noisy = [clean.clone(), clean.clone()]
    noisy[0][:, 5:7] = TOK.mask_token_id  # rank 0: block 1 is noised; rank 1: nothing is
    for r in (0, 1):
        Scorer(local)(noisy[r], attn, clean).sum().backward()
    expected = {n: p.grad / 2 for n, p in local.named_parameters() if p.grad is not None}

    sharded = shard_model(model)
    scorer = Scorer(sharded, lockstep_group=dist.group.WORLD)
    with torch.no_grad():
        scorer(noisy[rank], attn, clean)  # an old/reference pass: one forward on both ranks too
    values = scorer(noisy[rank], attn, clean)
    values.sum().backward()
    return {"zeros": bool((values == 0).all()), "gap": _max_gap(_full_grads(sharded), expected)}


def _moe_case(rank: int) -> dict[str, Any]:
    """An MoE family whose rows pick different experts per rank: 8 tokens on rank 0, 2 on rank 1
    (top-2 of 8 experts per layer: rank 1 leaves at least 4 of them without a gradient)."""
    from dllm_train.distributed import shard_model
    from tests.dllm_models.tiny_configs import build_tiny

    model = build_tiny("sdar_moe").train()
    local = copy.deepcopy(model)
    ids = [DIGITS[torch.randint(0, 12, (1, n), generator=torch.Generator().manual_seed(n))] for n in (8, 2)]
    local(ids[1]).logits.pow(2).mean().backward()
    unused_on_1 = sum(p.grad is None for p in local.parameters())
    local(ids[0]).logits.pow(2).mean().backward()
    expected = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) / 2 for n, p in local.named_parameters()}

    sharded = shard_model(model)
    sharded(ids[rank]).logits.pow(2).mean().backward()
    return {"unused_on_1": unused_on_1, "gap": _max_gap(_full_grads(sharded), expected)}


def _nan_case(rank: int) -> dict[str, float]:
    """A non-finite loss on rank 1 only: both ranks skip the step (and neither waits for the other)."""
    import dataclasses

    import torch.distributed as dist

    from dllm_train import ActorWorker, OptimConfig, Scorer
    from dllm_train.distributed import shard_model
    from tests.dllm_train.algo_helpers import tiny_model
    from tests.dllm_train.distributed_helpers import algorithm_objective

    objective = algorithm_objective("cj-grpo", {})
    real_loss = objective.loss

    def loss(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out, metrics = real_loss(*args, **kwargs)
        return (out * float("nan") if rank == 1 else out), metrics

    objective = dataclasses.replace(objective, loss=loss)
    model = shard_model(tiny_model("llada"))
    actor = ActorWorker(model, objective, OptimConfig(lr=1e-3),
                        scorer=Scorer(model, lockstep_group=dist.group.WORLD))
    exp = _experience(rank, "llada", objective)
    with torch.no_grad():
        exp.old_logp = objective.score(actor.scorer, exp)
    return actor.update(exp)


CASES = {
    # K replay states from each rank's step maps: 4 on rank 0, 2 on rank 1
    "cj-grpo-llada": ("llada", "cj-grpo", {}),
    "cj-grpo-sdar": ("sdar", "cj-grpo", {}),
    # one chunk per position: 4 chunks on rank 0, 2 on rank 1 (old pass and update alike)
    "justgrpo-llada": ("llada", "justgrpo", {"chunk_size": 1}),
}


def _all_cases(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {k: _algorithm_case(rank, *v) for k, v in CASES.items()}
    out["scorer"] = _scorer_case(rank)
    out["moe"] = _moe_case(rank)
    out["nan"] = _nan_case(rank)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_all_cases)


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_with_different_pass_counts_get_the_single_process_gradient(
        results: list[dict[str, Any]], case: str) -> None:
    for rank_result in results:
        r = rank_result[case]
        assert r["needs"][0] > r["needs"][1], r  # the mismatch: rank 0 needs more passes
        assert r["agreed"] == r["needs"][0], r  # both ranks run rank 0's count
        assert r["gap"] < 1e-6 * max(1.0, r["scale"]), r


def test_block_scorer_runs_one_forward_when_no_block_is_noised(results: list[dict[str, Any]]) -> None:
    assert not results[0]["scorer"]["zeros"] and results[1]["scorer"]["zeros"]
    for rank_result in results:
        assert rank_result["scorer"]["gap"] < 1e-6, rank_result["scorer"]


def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(results: list[dict[str, Any]]) -> None:
    for rank_result in results:
        assert rank_result["nan"]["skipped"] == 1.0, rank_result["nan"]


def test_moe_ranks_using_different_experts_reduce_the_same_buffers(results: list[dict[str, Any]]) -> None:
    # FSDP2 leaves a parameter without a gradient out of that rank's reduce-scatter unless told
    # otherwise (`shard_model` does): the ranks' buffers then differ in size and gloo aborts
    for rank_result in results:
        assert rank_result["moe"]["unused_on_1"] > 0, rank_result["moe"]
        assert rank_result["moe"]["gap"] < 1e-6, rank_result["moe"]
