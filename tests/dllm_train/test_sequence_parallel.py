"""Ulysses sequence parallelism on 2 gloo ranks equals the unsplit forward and backward."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.conftest import tiny_llada_config
from tests.dllm_models.tiny_configs import build_tiny
from tests.dllm_train.distributed_helpers import run_ranks


def _build(family: str) -> torch.nn.Module:
    from dllm_models import build_model

    if family == "llada":
        model = build_model(tiny_llada_config(n_kv_heads=2))  # GQA: 2 KV heads, 1 per rank
        model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.2)  # type: ignore[operator]
        return model.train()
    return build_tiny("sdar").train()  # block-causal, block 4, 2 KV heads


def _case(family: str, length: int) -> dict[str, Any]:
    from dllm_train.distributed import sp_forward

    model = _build(family)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 48, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, :3] = False  # a left-padded row
    w = torch.randn(2, length, 64 if family == "sdar" else 50, generator=g)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)

    ref = model(ids, attention_mask=mask, position_ids=pos).logits
    (ref * w).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    out = sp_forward(model, ids, mask, pos)
    (out * w).sum().backward()
    grads = {}
    for n, p in model.named_parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)  # each rank holds the gradient of its own positions
        grads[n] = p.grad
    err_logits = float((out - ref).detach().abs().max())
    err_grads = max(float((grads[n] - ref_grads[n]).abs().max()) for n in ref_grads)
    return {"logits": err_logits, "grads": err_grads, "scale": float(ref.abs().max())}


def _all_cases(rank: int) -> dict[str, dict[str, Any]]:
    # 14 splits evenly; 13 exercises the end padding; sdar 13 puts a block across the rank boundary
    return {f"{fam}-{n}": _case(fam, n) for fam in ("llada", "sdar") for n in (14, 13)}


@pytest.fixture(scope="module")
def sp_results() -> list[dict[str, dict[str, Any]]]:
    return run_ranks(_all_cases)


@pytest.mark.parametrize("case", ["llada-14", "llada-13", "sdar-14", "sdar-13"])
def test_ulysses_forward_and_grads_equal_unsplit(sp_results: list[dict[str, dict[str, Any]]], case: str) -> None:
    for rank_result in sp_results:
        r = rank_result[case]
        assert r["logits"] < 1e-5 * max(1.0, r["scale"]), r
        assert r["grads"] < 1e-4, r



# --- the actor through sequence parallelism: SequenceParallelScorer under FSDP2, 2 ranks, sp = 2 ---

def _scorer_case(family: str) -> dict[str, float]:
    """Direct scorer calls on odd-length rows (end padding), 2-D and candidate targets."""
    from dllm_train import Scorer
    from dllm_train.distributed import ParallelDims, SequenceParallelScorer, sequence_parallel_group
    from tests.tiny_rl import tiny_model

    model = tiny_model(family)
    group = sequence_parallel_group(ParallelDims(world_size=2, sequence_parallel=2), dist.get_rank())
    plain, split = Scorer(model), SequenceParallelScorer(model, group)
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(0, 12, (3, 13), generator=g)
    attn = torch.ones(3, 13, dtype=torch.bool)
    attn[1, :4] = False  # left padding
    noisy = torch.where(torch.rand(3, 13, generator=g) < 0.5, plain.mask_id, clean)
    cands = torch.randint(0, 12, (3, 13, 3), generator=g)
    err = 0.0
    with torch.no_grad():
        for targets in (clean, cands):
            ref = plain(noisy, attn, targets, clean_ids=clean)
            out = split(noisy, attn, targets, clean_ids=clean)
            err = max(err, float((ref - out).abs().max()))
    return {"err": err}


def _actor_case(family: str, algorithm: Any) -> dict[str, Any]:
    """Old log-probs, loss, gradients and weights of one update: unsplit vs sp = 2 under FSDP2."""
    import copy

    from dllm_train import ActorWorker, OptimConfig, Prepared, generator, plan_token_logp, sample_seeds, special_tokens
    from dllm_train.distributed import (
        ParallelDims,
        SequenceParallelScorer,
        full_state_dict,
        sequence_parallel_group,
        shard_model,
    )
    from tests.tiny_rl import local_rl, tiny_model

    model = tiny_model(family)
    wf = local_rl(model, algorithm)
    prompts, answers, groups = wf.prompts(0).expanded()
    rollout = wf.rank.rollout.generate(prompts, sample_seeds(0, len(prompts), "rollout", 0))
    batch = wf.rank.reward.score(rollout, answers, groups, special_tokens(model))
    optim = OptimConfig(lr=1e-2, grad_clip=0.0)  # no clipping: the gradients themselves are compared

    # fixed non-zero advantages: an untrained tiny model's group rewards may all be equal
    advantages = torch.randn(len(prompts), generator=torch.Generator().manual_seed(3))

    def run(actor: ActorWorker[Any]) -> tuple[Prepared[Any], torch.Tensor, dict[str, float]]:
        prepared = actor.prepare(batch, generator(0, "plan", 0))
        plan = prepared.data
        with torch.no_grad():  # per-token log-probs of every noised copy of the plan
            tokens = plan_token_logp(actor.scorer, rollout.input_ids, rollout.attention_mask, plan)
        return prepared, tokens, actor.update(prepared, advantages)

    # reuse_old=False: the old values come from their own pass, through the split forward too
    local = copy.deepcopy(model)
    local_prep, local_tokens, local_metrics = run(ActorWorker(local, algorithm, optim, reuse_old=False))
    local_grads = {n: p.grad for n, p in local.named_parameters() if p.grad is not None}

    group = sequence_parallel_group(ParallelDims(world_size=2, sequence_parallel=2), dist.get_rank())
    sharded = shard_model(copy.deepcopy(model))
    prep, tokens, metrics = run(ActorWorker(sharded, algorithm, optim, scorer=SequenceParallelScorer(sharded, group),
                                            reuse_old=False))
    grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters() if p.grad is not None}  # type: ignore[attr-defined]
    full, ref, init = full_state_dict(sharded), local.state_dict(), model.state_dict()
    grad_scale = max(float(g.abs().max()) for g in local_grads.values())
    zero = torch.zeros(1)
    assert prep.old is not None and local_prep.old is not None
    return {
        "old": max(float((a - b).abs().max()) for a, b in zip(prep.old, local_prep.old)),
        "token": float((tokens - local_tokens).abs().max()),
        "token_scale": float(local_tokens.abs().max()),
        "loss": (metrics["loss"], local_metrics["loss"]),
        "grad_norm": (metrics["grad_norm"], local_metrics["grad_norm"]),
        "grad_keys": sorted(grads) == sorted(local_grads),
        "grad": max(float((grads[n] - local_grads[n]).abs().max()) for n in local_grads),
        "grad_scale": grad_scale,
        "weights": max(float((full[k] - ref[k]).abs().max()) for k in ref),
        # where the gradient stands well above rounding (Adam's first step is ~lr * sign(g) there)
        "weights_sig": max(float(torch.cat([(full[n] - ref[n])[g.abs() > 1e-3 * grad_scale].abs(), zero]).max())
                           for n, g in local_grads.items()),
        "moved": max(float((ref[k] - init[k]).abs().max()) for k in ref),
    }


def _actor_cases(rank: int) -> dict[str, dict[str, Any]]:
    from dllm_algorithms import BGPO, D1

    out: dict[str, dict[str, Any]] = {f"scorer-{f}": _scorer_case(f) for f in ("llada", "dream", "sdar")}
    out["actor-llada"] = _actor_case("llada", D1())
    out["actor-sdar"] = _actor_case("sdar", BGPO(mc_num=2))
    return out


@pytest.fixture(scope="module")
def sp_actor_results() -> list[dict[str, dict[str, Any]]]:
    return run_ranks(_actor_cases)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar"])
def test_sequence_parallel_scorer_equals_unsplit_scorer(sp_actor_results: list[dict[str, dict[str, Any]]],
                                                        family: str) -> None:
    # odd length 13 (end padding), a left-padded row, 2-D and candidate targets; Dream's logit shift
    # crosses the rank boundary; SDAR's BD3LM rows hold a block straddling the two ranks
    for rank_result in sp_actor_results:
        assert rank_result[f"scorer-{family}"]["err"] < 1e-5, rank_result


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_actor_with_sequence_parallel_equals_single_process(sp_actor_results: list[dict[str, dict[str, Any]]],
                                                            family: str) -> None:
    for rank_result in sp_actor_results:
        r = rank_result[f"actor-{family}"]
        assert r["token"] < 1e-5 * max(1.0, r["token_scale"]), r  # per-token log-probs of the plan
        assert r["old"] < 1e-5, r  # the algorithm's old values, through the split forward
        assert r["loss"][0] == pytest.approx(r["loss"][1], rel=1e-5, abs=1e-7), r
        assert r["loss"][0] != 0.0, r
        assert r["grad_keys"], r
        assert r["grad_scale"] > 1e-3, r
        assert r["grad"] < 1e-5 * r["grad_scale"], r  # the step's gradients: summed over ranks, not x sp
        assert r["grad_norm"][0] == pytest.approx(r["grad_norm"][1], rel=1e-5), r
        # Adam divides by sqrt(v): rounding-level gradient differences of near-zero entries move
        # those weights by up to a fraction of lr (measured: 6 % of a step on SDAR), so all weights
        # are compared to the step size, and those with a real gradient tightly
        assert r["weights"] < 0.2 * r["moved"], r
        assert r["weights_sig"] < 1e-3 * r["moved"], r
