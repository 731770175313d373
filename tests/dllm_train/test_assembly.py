"""One rank assembly for both backends: `assemble_rank` builds the same workers locally and sharded.

The local backend calls it without hooks, a Ray rank with FSDP2 sharding (`shard`) and lockstep
scorers (`scorer`); here a recording `shard` hook stands in for FSDP2, so no process group starts.
The last test builds real FSDP2 `RankWorker`s on two gloo ranks (no Ray).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dllm_algorithms as da
from dllm_models import BaseWeightsView
from dllm_train import (
    BaseWeightsScorer,
    LocalRL,
    OffloadedScorer,
    OptimConfig,
    PolicyRank,
    RewardWorker,
    RLAlgorithm,
    Scorer,
    TrainerConfig,
    assemble_rank,
    generator,
)
from dllm_train.assembly import plain_scorer
from tests.dllm_train.distributed_helpers import run_ranks
from tests.tiny_rl import SAMPLING, TOK, partial_reward, tiny_model

ALGORITHMS: dict[str, RLAlgorithm[Any]] = {
    "none": da.D1(),  # no reference
    "reference": da.ESPO(mc_num=2, num_iterations=1),  # a KL term: a reference pass
    "rollout_reference": da.DMPO(),  # the rollout scores with the reference
}


def _lora(model: Any) -> Any:
    from dllm_models import apply_lora

    apply_lora(model, rank=2, alpha=4.0)
    return model


class Sharding:
    """A stand-in for FSDP2: records which model it wraps, with which offload, and returns it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, bool]] = []

    def __call__(self, model: Any, *, offload: bool) -> Any:
        self.calls.append((model, offload))
        return model

    def offloaded(self, model: Any) -> bool:
        return any(m is model and off for m, off in self.calls)


def _assemble(model: Any, algorithm: RLAlgorithm[Any], trainer: TrainerConfig, **hooks: Any) -> PolicyRank[Any]:
    return assemble_rank(model, sampling=SAMPLING, algorithm=algorithm, optim=OptimConfig(lr=1e-3), trainer=trainer,
                         reward=RewardWorker(partial_reward, TOK.decode),
                         plan_generator=lambda step: generator(0, "plan", step), **hooks)


def _shape(parts: PolicyRank[Any], model: Any, sharding: Sharding | None) -> dict[str, Any]:
    """What a rank's assembly decided, in terms both backends share."""
    ref = parts.reference
    policy = parts.actor.model
    ref_model = getattr(parts.rollout, "ref_model", None)
    frozen = None if ref_model is None or isinstance(ref_model, BaseWeightsView) else not any(
        p.requires_grad for p in ref_model.parameters())
    return {
        "actor_trains_the_policy": policy is model,
        "reference": None if ref is None else type(ref.scorer).__name__.replace("Offloaded", ""),
        "reference_is_the_policy": ref is not None and ref.model is policy,
        "reference_offloaded": ref is not None and (isinstance(ref.scorer, OffloadedScorer)
                                                     or (sharding is not None and sharding.offloaded(ref.model))),
        "rollout_reference": None if ref_model is None else type(ref_model).__name__,
        "rollout_reference_is_frozen": frozen,
    }


def _parts(name: str, *, lora: bool, sharding: Sharding | None, **trainer: Any) -> tuple[PolicyRank[Any], Any]:
    model = tiny_model("llada")
    if lora:
        _lora(model)
    return _assemble(model, ALGORITHMS[name], TrainerConfig(**trainer), shard=sharding), model


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_local_and_sharded_assemblies_build_the_same_workers(name: str, lora: bool, offload: bool) -> None:
    local, local_model = _parts(name, lora=lora, sharding=None, reference_offload=offload)
    sharding = Sharding()
    sharded, sharded_model = _parts(name, lora=lora, sharding=sharding, reference_offload=offload)
    assert _shape(local, local_model, None) == _shape(sharded, sharded_model, sharding)
    shape = _shape(local, local_model, None)
    alg = ALGORITHMS[name]
    assert (shape["reference"] is not None) == alg.needs_reference
    if alg.needs_reference:  # LoRA: the policy's base weights, no copy; else a copy, offloaded as asked
        assert shape["reference"] == ("BaseWeightsScorer" if lora else "Scorer")
        assert shape["reference_is_the_policy"] == lora
        assert shape["reference_offloaded"] == (offload and not lora)
    if not alg.needs_rollout_reference:
        assert shape["rollout_reference"] is None
    else:  # LoRA: the rollout model's base weights; else a frozen copy of the initial policy
        assert shape["rollout_reference"] == ("BaseWeightsView" if lora else type(local_model).__name__)
        assert shape["rollout_reference_is_frozen"] == (None if lora else True)
    # the local rollout decodes the policy itself; a sharded rank an unsharded replica of it
    assert local.rollout.model is local_model
    assert sharded.rollout.model is not sharded_model
    assert all(torch.equal(v, sharded_model.state_dict()[k]) for k, v in sharded.rollout.model.state_dict().items())
    # the sharded rank wraps the reference copy (offloaded on request) and the policy, nothing else
    wrapped = [(m is sharded_model, off) for m, off in sharding.calls]
    copies = [(False, offload)] if alg.needs_reference and not lora else []
    assert wrapped == [*copies, (True, False)]


def test_local_rl_is_the_assembly_without_hooks() -> None:
    # `LocalRL` builds its rank with `assemble_rank`: the same reference rules, offload included
    from tests.tiny_rl import addition_prompts

    model = tiny_model("llada")
    rl = LocalRL(model, prompts=addition_prompts(2, 4), sampling=SAMPLING, reward_fn=partial_reward,
                 detokenize=TOK.decode, algorithm=ALGORITHMS["reference"], optim=OptimConfig(lr=1e-3),
                 trainer=TrainerConfig(reference_offload=True))
    assert rl.rank.actor.model is model and rl.rank.rollout.model is model
    assert rl.rank.reference is not None and isinstance(rl.rank.reference.scorer, OffloadedScorer)
    assert rl.rank.reference.model is not model


def test_the_scorer_hook_gets_the_assemblys_choice_of_scorer() -> None:
    seen: list[tuple[type[Scorer], str | None, bool]] = []

    def scorer(model: Any, *, kind: type[Scorer], attention: str | None, shared_context: bool) -> Scorer:
        seen.append((kind, attention, shared_context))
        return plain_scorer(model, kind=kind, attention=attention, shared_context=shared_context)

    model = _lora(tiny_model("sdar"))
    _assemble(model, ALGORITHMS["reference"], TrainerConfig(bd3lm_layout="doubled"), scorer=scorer)
    # the actor's scorer, then LoRA's base-weights reference; "auto" attention on CPU for a block family: sdpa
    assert seen == [(Scorer, "sdpa", False), (BaseWeightsScorer, "sdpa", False)]


def _offload_on_fsdp(rank: int) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy

    from dllm_train import sample_seeds
    from dllm_train.distributed import RankWorker
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup
    from tests.tiny_rl import addition_prompts

    prompts, answers, groups = addition_prompts(2, 4)(0).expanded()
    rows = slice(4 * rank, 4 * rank + 4)
    seeds = sample_seeds(0, len(prompts), "rollout", 0)
    out: dict[str, Any] = {}
    for offload in (False, True):
        worker = RankWorker(algorithm_rank_setup("llada", ALGORITHMS["reference"], reference_offload=offload))
        reference = worker.policy.reference
        assert reference is not None
        state: Any = reference.model._get_fsdp_state()._fsdp_param_group
        worker.rollout_step(0, prompts[rows], answers[rows], seeds[rows], groups[rows])
        assert worker.policy.prepared is not None and worker.policy.prepared.ref is not None
        actor_state: Any = worker.model._get_fsdp_state()._fsdp_param_group
        out[str(offload)] = {"cpu_offload": isinstance(state.offload_policy, CPUOffloadPolicy),
                             "actor_cpu_offload": isinstance(actor_state.offload_policy, CPUOffloadPolicy),
                             "ref": [t.detach().clone() for t in worker.policy.prepared.ref]}
    return out


@pytest.mark.slow
def test_reference_offload_is_honoured_on_fsdp_ranks() -> None:
    # trainer.reference_offload on a Ray rank: FSDP2 keeps the sharded reference on the CPU
    # (CPUOffloadPolicy); its values are those of the reference kept on the device
    for res in run_ranks(_offload_on_fsdp):
        assert not res["False"]["cpu_offload"] and res["True"]["cpu_offload"]
        assert not res["False"]["actor_cpu_offload"] and not res["True"]["actor_cpu_offload"]
        for a, b in zip(res["False"]["ref"], res["True"]["ref"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

