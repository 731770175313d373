"""The rollout record in a run: algorithms declare the fields they read, one rule refuses a backend that
does not fill one, and `trainer.save_rollouts_every` stores each step's record for `read_rollouts`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dllm_algorithms import BGPO, CJGRPO, D1, DMPO, MDPO, DTreeRPO
from dllm_rollout import RECORD_FIELDS, SamplingConfig, generate
from dllm_train import (
    LocalRL,
    OptimConfig,
    PhaseSpec,
    RLAlgorithm,
    RolloutSaver,
    Run,
    TrainerConfig,
    check_rollout_record,
    read_rollouts,
    rollout_path,
)
from dllm_train.rollout_record import check_rollout_filled
from tests.tiny_rl import SAMPLING, TOK, addition_prompts, partial_reward, tiny_model

NATIVE = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0)
LMDEPLOY = dataclasses.replace(NATIVE, engine="lmdeploy", block_diffusion=True)


@dataclass(frozen=True)
class StepMapGRPO(D1):
    """An algorithm that reads the commit step of each token (as TraceRL does)."""

    record_fields = frozenset({"unmask_step"})


def test_the_algorithms_declare_the_fields_they_read() -> None:
    # derived from the flags they carried before: replays_trajectory (CJ-GRPO, MDPO, DMPO) and
    # needs_rollout_reference (DMPO), and the switches their `sampling` turned on
    assert CJGRPO.record_fields == {"unmask_step"}
    assert MDPO.record_fields == {"step_canvas", "step_x0", "step_confidence"}
    assert DMPO.record_fields == {"step_logp", "ref_step_logp"}
    for plain in (D1(), BGPO(), DTreeRPO()):
        assert plain.record_fields == frozenset() and not plain.replays_trajectory
        assert not plain.needs_rollout_reference and plain.sampling(NATIVE) is NATIVE
    assert [a.replays_trajectory for a in (CJGRPO(), MDPO(), DMPO())] == [True] * 3
    assert [a.needs_rollout_reference for a in (CJGRPO(), MDPO(), DMPO())] == [False, False, True]
    assert CJGRPO().sampling(NATIVE).record_trajectory and not CJGRPO().sampling(NATIVE).record_steps
    assert MDPO().sampling(NATIVE).record_steps and DMPO().sampling(NATIVE).record_trajectory
    assert StepMapGRPO().sampling(NATIVE).record_trajectory and StepMapGRPO().replays_trajectory


def test_the_flag_of_before_declares_the_reference_field() -> None:
    # an algorithm written before `record_fields` (needs_rollout_reference = True) is refused by the same rule
    legacy = dataclass(frozen=True)(type("Legacy", (D1,), {"needs_rollout_reference": True}))()
    assert legacy.record_fields == {"ref_step_logp"} and legacy.needs_rollout_reference
    assert _refusal(legacy, LMDEPLOY).startswith("algorithm Legacy needs rollout record field 'ref_step_logp'")
    plain = dataclass(frozen=True)(type("Plain", (DMPO,), {"needs_rollout_reference": False}))()
    assert plain.record_fields == {"step_logp"} and not plain.needs_rollout_reference


def test_an_unknown_record_field_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(ValueError, match=r"Bad.record_fields: \['step_map'\] are not rollout record fields"):
        type("Bad", (D1,), {"record_fields": frozenset({"step_map"})})


def _refusal(algorithm: RLAlgorithm[object] | None, sampling: SamplingConfig) -> str:
    with pytest.raises(ValueError) as err:
        check_rollout_record(algorithm, algorithm.sampling(sampling) if algorithm is not None else sampling)
    return str(err.value)


def test_one_rule_refuses_a_field_the_backend_does_not_fill() -> None:
    assert _refusal(MDPO(), LMDEPLOY) == ("algorithm MDPO needs rollout record field 'step_canvas', which "
                                          "rollout.engine=lmdeploy does not fill; use rollout.engine=native")
    assert _refusal(StepMapGRPO(), LMDEPLOY) == ("algorithm StepMapGRPO needs rollout record field 'unmask_step', "
                                                 "which rollout.engine=lmdeploy does not fill; use rollout.engine=native")
    # the reference log-probs are scored during native decoding only
    assert _refusal(DMPO(), LMDEPLOY).startswith("algorithm DMPO needs rollout record field 'ref_step_logp'")
    # the run's own switch, with no algorithm asking
    assert _refusal(BGPO(), dataclasses.replace(LMDEPLOY, record_trajectory=True)) == (
        "rollout.record_trajectory=true asks for rollout record field 'step_logp', which rollout.engine=lmdeploy "
        "does not fill; use rollout.engine=native or set rollout.record_trajectory=false")
    assert _refusal(None, dataclasses.replace(LMDEPLOY, record_steps=True)).startswith(
        "rollout.record_steps=true asks for rollout record field 'step_canvas'")
    # an algorithm that runs its own rollout (a tree) runs it natively
    assert _refusal(DTreeRPO(), LMDEPLOY) == ("algorithm DTreeRPO runs its own rollout (not the standard decoder), "
                                              "which rollout.engine=lmdeploy cannot run: set rollout.engine=native")

    @dataclass(frozen=True)
    class TailReader(D1):
        record_fields = frozenset({"tail_ids"})

    assert _refusal(TailReader(), NATIVE) == ("algorithm TailReader needs rollout record field 'tail_ids', which the "
                                              "native masked-diffusion decoder does not fill; use a model whose decoder "
                                              "fills it")
    for algorithm in (D1(), BGPO(), CJGRPO(), MDPO(), DMPO(), DTreeRPO(), StepMapGRPO()):
        check_rollout_record(algorithm, algorithm.sampling(NATIVE))  # the native decoders fill them all
    check_rollout_record(BGPO(), LMDEPLOY)


def test_a_rollout_that_lacks_a_declared_field_is_refused_at_the_step() -> None:
    model = tiny_model("llada")
    out = generate(model, [[1, 2, 3]], NATIVE, seed=0)
    check_rollout_filled(D1(), out)
    with pytest.raises(RuntimeError, match=r"lacks record fields \['unmask_step'\] that algorithm StepMapGRPO"):
        check_rollout_filled(StepMapGRPO(), out)


def test_the_trainer_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="trainer.save_rollouts_every must be >= 0"):
        TrainerConfig(save_rollouts_every=-1)
    assert TrainerConfig(save_rollouts_every=2, backend="ray").save_rollouts_every == 2  # every backend stores them


def _local(model: torch.nn.Module, out: Path | None, every: int) -> LocalRL:
    return LocalRL(model, prompts=addition_prompts(2, 2, 0), sampling=SAMPLING, reward_fn=partial_reward,
                   detokenize=TOK.decode, algorithm=StepMapGRPO(), optim=OptimConfig(lr=1e-3),
                   trainer=TrainerConfig(max_steps=4, save_rollouts_every=every), output_dir=out)


def test_a_run_stores_every_nth_rollout_and_reads_it_back(tmp_path: Path) -> None:
    model = tiny_model("llada")
    wf = _local(model, tmp_path, 2)
    seen: list[object] = []
    generate_ = wf.rank.rollout.generate

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(generate_(*args, **kwargs))  # type: ignore[arg-type]
        return seen[-1]

    wf.rank.rollout.generate = spy  # type: ignore[method-assign]
    run = Run(tmp_path, model, progress=False)
    run.run_phase(PhaseSpec(order=0, name="rl", steps=4, step_fn=wf.step, owner=wf))
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_000002.rank0.safetensors",
                                                                          "step_000004.rank0.safetensors"]
    stored = read_rollouts(tmp_path)
    assert list(stored) == [2, 4] and [len(v) for v in stored.values()] == [1, 1]
    for step, batch in ((2, seen[1]), (4, seen[3])):
        back = stored[step][0]
        assert back.filled_fields() == batch.filled_fields() >= {"unmask_step", "forwards"}  # type: ignore[attr-defined]
        for name, spec in RECORD_FIELDS.items():
            if not spec.in_extras and isinstance(getattr(back, name), torch.Tensor):
                assert torch.equal(getattr(back, name), getattr(batch, name)), name
        assert back.config == batch.config  # type: ignore[attr-defined]
    assert list(read_rollouts(tmp_path, steps=[4])) == [4] and read_rollouts(tmp_path / "none") == {}
    with pytest.raises(ValueError, match="pass LocalRL"):
        _local(tiny_model("llada"), None, 2)


def test_a_saver_writes_only_on_its_period(tmp_path: Path) -> None:
    model = tiny_model("llada")
    out = generate(model, [[1, 2, 3]], NATIVE, seed=0)
    save = RolloutSaver(tmp_path, 3, rank=1)
    for step in range(6):
        save(step, out)
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == [
        rollout_path(tmp_path, 3, 1).name, rollout_path(tmp_path, 6, 1).name]
    with pytest.raises(ValueError, match="must be >= 1"):
        RolloutSaver(tmp_path, 0)


def _rank_rollouts(run_dir: str, rank: int) -> list[int]:
    """One rollout step on a Ray-style rank (FSDP2, gloo) that stores its data-parallel group's record."""
    from dllm_train import sample_seeds
    from dllm_train.distributed import RankWorker
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup

    setup = dataclasses.replace(algorithm_rank_setup("llada", CJGRPO(), save_rollouts_every=1), run_dir=run_dir)
    worker = RankWorker(setup)
    prompts, answers, groups = addition_prompts(2, 2)(0).expanded()
    seeds = sample_seeds(0, len(prompts), "rollout", 0)
    rows = slice(2 * rank, 2 * rank + 2)
    worker.rollout_step(0, prompts[rows], answers[rows], seeds[rows], groups[rows])
    return [int(s) for s in seeds[rows]]


@pytest.mark.slow
def test_each_data_parallel_rank_stores_its_own_rows(tmp_path: Path) -> None:
    import functools

    from tests.dllm_train.distributed_helpers import run_ranks

    seeds = run_ranks(functools.partial(_rank_rollouts, str(tmp_path)))
    stored = read_rollouts(tmp_path)
    assert list(stored) == [1] and len(stored[1]) == 2
    for rank, batch in enumerate(stored[1]):
        assert batch.seeds.tolist() == seeds[rank] and batch.unmask_step is not None


def test_a_rank_without_the_run_folder_refuses_to_store() -> None:
    from dllm_train.distributed import RankWorker
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup

    worker = RankWorker.__new__(RankWorker)  # only the store is built: no process group
    assert worker._rollout_saver(algorithm_rank_setup("llada", D1())) is None
    with pytest.raises(ValueError, match=r"trainer.save_rollouts_every=1 stores rollouts in the run folder: pass "
                                         r"RankSetup\(..., run_dir=<run folder>\)"):
        worker._rollout_saver(algorithm_rank_setup("llada", D1(), save_rollouts_every=1))
