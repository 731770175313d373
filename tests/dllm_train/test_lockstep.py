"""Lockstep passes under FSDP2: ranks that need different numbers of token-budget passes (or
use different experts) still run the same collectives (no deadlock) and get exactly the gradient
of the single-process computation.

Every case runs on 2 gloo ranks whose rows need different numbers of forward/backward passes
(rank 0 more than rank 1). FSDP2 averages the two ranks' gradients, so the expected gradient is
(g_0 + g_1) / 2, where g_r is the gradient of rank r's own loss computed in one process on the
unsharded model in one forward.
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
        response_mask[:, 2:] = False  # two counted tokens: fewer replay states and shorter rows
        if family != "sdar":  # a block decoder finishes the terminal block: CJ-GRPO replays its steps
            unmask = torch.where(response_mask, unmask, -1)
    return RolloutBatch(
        prompt_ids=DIGITS[torch.randint(0, 12, (b, p), generator=g)],
        prompt_mask=torch.ones(b, p, dtype=torch.bool),
        response_ids=DIGITS[torch.randint(0, 12, (b, r), generator=g)],
        response_mask=response_mask, seeds=torch.zeros(b, dtype=torch.long), unmask_step=unmask,
        config=SamplingConfig(max_new_tokens=r, steps=steps, block_length=r, block_diffusion=family == "sdar"),
    )


def _prepared(rank: int, family: str, alg: Any, model: Any) -> tuple[Any, torch.Tensor]:
    from dllm_train import Prepared, RLBatch, special_tokens

    g = torch.Generator().manual_seed(100 + rank)
    batch = RLBatch(rollout=_rollout(rank, family, g), scores=torch.zeros(4), group_ids=torch.tensor([0, 0, 1, 1]),
                    tokens=special_tokens(model))
    return Prepared(batch=batch, data=alg.prepare(batch, g)), torch.randn(4, generator=g)


def _loss_fn(alg: Any, prepared: Any, advantages: torch.Tensor) -> Any:
    from dllm_train import LossInputs

    def loss(values: torch.Tensor) -> Any:
        return alg.loss(values, LossInputs(batch=prepared.batch, data=prepared.data, iteration=0,
                                           advantages=advantages, old=values.detach(), ref=None))
    return loss


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


def _algorithm_case(rank: int, family: str, name: str, attention: str | None, budget: int) -> dict[str, Any]:
    import torch.distributed as dist

    from dllm_train import Scorer, accumulate
    from dllm_train.distributed import shard_model
    from dllm_train.passes import split, trace
    from tests.dllm_algorithms.cases import ALGORITHMS
    from tests.tiny_rl import tiny_model

    alg = ALGORITHMS[name]
    model = tiny_model(family).train()
    local = copy.deepcopy(model)
    cases = [_prepared(r, family, alg, model) for r in (0, 1)]
    needs = []
    for prepared, adv in cases:  # single process, unsharded, one forward: g_0 + g_1
        def values(s: Any, prepared: Any = prepared) -> torch.Tensor:
            return alg.values(s, prepared.batch, prepared.data, 0)
        scorer = Scorer(local, attention=attention)
        needs.append(len(split(trace(values, scorer), scorer, budget)))
        _loss_fn(alg, prepared, adv)(values(scorer))[0].backward()
    expected = {n: p.grad / 2 for n, p in local.named_parameters() if p.grad is not None}

    sharded = shard_model(model)
    scorer = Scorer(sharded, lockstep_group=dist.group.WORLD, attention=attention)
    prepared, adv = cases[rank]
    result = accumulate(lambda s: alg.values(s, prepared.batch, prepared.data, 0), _loss_fn(alg, prepared, adv),
                        scorer, max_tokens=budget, row_local=alg.row_local)
    return {"needs": needs, "agreed": result.forwards, "row_local": alg.row_local,
            "gap": _max_gap(_full_grads(sharded), expected),
            "scale": max(float(v.abs().max()) for v in expected.values())}


def _scorer_case(rank: int) -> dict[str, Any]:
    """A block-family scorer call whose rows hold a noised token on rank 0 and none on rank 1."""
    import torch.distributed as dist

    from dllm_train import Scorer
    from dllm_train.distributed import shard_model
    from tests.tiny_rl import TOK, tiny_model

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

    import dllm_algorithms as da
    from dllm_train import ActorWorker, LossInputs, OptimConfig, Scorer
    from dllm_train.distributed import shard_model
    from tests.tiny_rl import tiny_model

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Poisoned(da.CJGRPO):
        def loss(self, values: torch.Tensor, inputs: LossInputs[Any]) -> Any:
            out, metrics = super().loss(values, inputs)
            return (out * float("nan") if rank == 1 else out), metrics

    alg = Poisoned()
    model = shard_model(tiny_model("llada"))
    actor = ActorWorker(model, alg, OptimConfig(lr=1e-3), scorer=Scorer(model, lockstep_group=dist.group.WORLD),
                        max_tokens_per_pass=1)
    prepared, adv = _prepared(rank, "llada", alg, model)
    return actor.update(actor.prepare(prepared.batch, torch.Generator().manual_seed(0)), adv)


CASES = {
    # K replay states from each rank's step maps: 4 on rank 0, 2 on rank 1; one row per pass
    "cj-grpo-llada": ("llada", "CJGRPO", None, 1),
    "cj-grpo-sdar": ("sdar", "CJGRPO", None, 1),
    # one state per response position: 4 on rank 0, 2 on rank 1
    "justgrpo-llada": ("llada", "JustGRPO", None, 1),
    # a loss coupling rows (value pass, then gradient passes): packed rows of 7 vs 5 tokens, so a
    # 10-token budget holds one row of rank 0 but two of rank 1
    "coupled-grpo-llada": ("llada", "CoupledGRPO", "sdpa", 10),
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
        # both ranks run rank 0's count (twice over when a value pass comes first)
        assert r["agreed"] == r["needs"][0] * (1 if r["row_local"] else 2), r
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
