"""The trainer's mini-batches (`RLAlgorithm.mini_batch_rows`): K copies of the rollout batch become
K optimizer steps per iteration, each on its own rows against old values computed once, and every
RL step reports `optimizer_steps`. A toy algorithm (not a library one) exercises the capability."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from dllm_train import LossInputs, MiniBatchRows, RLAlgorithm, RLBatch, check_settings, mini_batch_slices, sequence_inputs
from tests.tiny_rl import SAMPLING, local_rl, text_reward, tiny_model

COPIES = 3


@dataclass(frozen=True)
class Rows:
    """COPIES x B rows, copy-major: noisy inputs, targets, attention, the response positions."""

    noisy: torch.Tensor
    clean: torch.Tensor
    attention: torch.Tensor
    active: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class CopiesPG(RLAlgorithm[Rows]):
    """A toy ratio policy gradient on COPIES fully masked copies of every sample."""

    rows: MiniBatchRows = "rollout"
    num_iterations: int = 1
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mini_batch_rows(self) -> MiniBatchRows:
        return self.rows

    def num_rows(self, data: Rows) -> int:
        return int(data.noisy.shape[0])

    def select_rows(self, data: Rows, rows: slice) -> Rows:
        return Rows(data.noisy[rows], data.clean[rows], data.attention[rows], data.active[rows])

    def prepare(self, batch: RLBatch, generator: torch.Generator) -> Rows:
        ids, attn, _, response = sequence_inputs(batch.rollout)
        noisy = torch.where(response, batch.tokens.mask_id, ids)
        rep = (COPIES, 1)
        return Rows(noisy.repeat(*rep), ids.repeat(*rep), attn.repeat(*rep), response.repeat(*rep))

    def values(self, scorer: Any, batch: RLBatch, data: Rows, iteration: int) -> torch.Tensor:
        out: torch.Tensor = scorer(data.noisy, data.attention, data.clean)
        return out

    def loss(self, values: torch.Tensor, inputs: LossInputs[Rows]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        assert inputs.old is not None
        m = inputs.data.active.float()
        ratio = torch.exp(values - inputs.old)
        loss = -(ratio * m).sum() / m.sum()
        if not torch.is_grad_enabled():
            self.records.append({"rows": values.shape[0], "ratio": ratio[inputs.data.active]})
        return loss, {"rows": torch.tensor(float(values.shape[0]))}


def _update(alg: CopiesPG) -> tuple[Any, dict[str, float]]:
    model = tiny_model("llada")
    rl = local_rl(model, alg, reward=text_reward, lr=5e-2, grad_clip=0.0)
    return rl, rl.step(0)


def test_slices_follow_the_rollout_batch() -> None:
    @dataclass
    class Rollout:
        batch_size: int

    @dataclass
    class Batch:
        rollout: Rollout

    alg, data, batch = CopiesPG(), Rows(*(torch.zeros(20, 2),) * 4), Batch(Rollout(8))
    assert mini_batch_slices(alg, batch, data) == [slice(0, 8), slice(8, 16), slice(16, 20)]  # type: ignore[arg-type]
    assert mini_batch_slices(dataclasses.replace(alg, rows="all"), batch, data) == [slice(None)]  # type: ignore[arg-type]


@pytest.mark.parametrize("iterations", [1, 2])
def test_one_optimizer_step_per_copy_against_old_values_computed_once(iterations: int) -> None:
    alg = CopiesPG(num_iterations=iterations)
    rl, metrics = _update(alg)
    assert not rl.actor.old_from_training_pass  # later mini-batches need the rollout policy's values
    assert metrics["optimizer_steps"] == COPIES * iterations and rl.actor.updates == COPIES * iterations
    b = 2 * 4  # prompts_per_step x group_size of local_rl
    assert [r["rows"] for r in alg.records] == [b] * (COPIES * iterations)
    assert float((alg.records[0]["ratio"] - 1).abs().max()) < 1e-6  # on-policy first step
    assert all(float((r["ratio"] - 1).abs().max()) > 1e-4 for r in alg.records[1:])  # old values stay fixed
    assert metrics["rows"] == b


def test_all_rows_in_one_step_is_the_default_behaviour() -> None:
    alg = CopiesPG(rows="all")
    rl, metrics = _update(alg)
    assert metrics["optimizer_steps"] == 1 and [r["rows"] for r in alg.records] == [COPIES * 8]


def test_a_skipped_mini_batch_is_not_counted() -> None:
    alg = CopiesPG()
    model = tiny_model("llada")
    rl = local_rl(model, alg, reward=text_reward, lr=5e-2, grad_clip=0.0)
    real = alg.loss
    calls = {"n": 0}

    def second_is_nan(values: torch.Tensor, inputs: LossInputs[Rows]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss, metrics = real(values, inputs)
        if not torch.is_grad_enabled():
            calls["n"] += 1
        # the evaluation of the second mini-batch's loss (the one the skip check reads)
        return (loss * float("nan"), metrics) if calls["n"] == 2 and not torch.is_grad_enabled() else (loss, metrics)

    object.__setattr__(alg, "loss", second_is_nan)
    metrics = rl.step(0)
    assert metrics["optimizer_steps"] == COPIES - 1 and rl.actor.skipped == 1
    assert metrics["skipped"] == 1.0  # skipped steps are counted, as optimizer_steps are


def test_rollout_mini_batches_need_a_way_to_cut_the_data() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Uncut(RLAlgorithm[Rows]):
        @property
        def mini_batch_rows(self) -> MiniBatchRows:
            return "rollout"

        prepare = CopiesPG.prepare
        values = CopiesPG.values
        loss = CopiesPG.loss

    with pytest.raises(ValueError, match="defines no num_rows / select_rows"):
        check_settings(Uncut(), SAMPLING, consistency_every=0)


def test_metrics_jsonl_records_the_optimizer_steps_of_every_rl_step(tmp_path: Any) -> None:
    from dllm_train import PhaseSpec, Run, read_metrics

    model = tiny_model("llada")
    rl = local_rl(model, CopiesPG(), reward=text_reward)
    Run(tmp_path, model, progress=False).run_phase(PhaseSpec(order=0, name="rl", steps=2, step_fn=rl.step, owner=rl))
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["optimizer_steps"] for r in records] == [COPIES, COPIES]


def test_prompt_sized_slices_follow_the_prompts_of_the_batch() -> None:
    @dataclass
    class Rollout:
        batch_size: int

    @dataclass
    class Batch:
        rollout: Rollout
        group_ids: torch.Tensor

    # 3 prompts x 4 samples, 20 training rows: mini-batches of 3 rows (verl's ppo_mini_batch_size = prompts, n = 1)
    alg, data = CopiesPG(rows="prompts"), Rows(*(torch.zeros(20, 2),) * 4)
    batch = Batch(Rollout(12), torch.arange(3).repeat_interleave(4))
    assert mini_batch_slices(alg, batch, data) == [slice(a, min(a + 3, 20)) for a in range(0, 20, 3)]  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class SameEveryIteration(CopiesPG):
    """CopiesPG whose values ignore the iteration: the old and reference passes run once."""

    values_vary_by_iteration = False
    calls: list[int] = field(default_factory=list)

    def values(self, scorer: Any, batch: RLBatch, data: Rows, iteration: int) -> torch.Tensor:
        if not torch.is_grad_enabled():
            self.calls.append(iteration)
        return super().values(scorer, batch, data, iteration)


def test_values_that_ignore_the_iteration_take_one_old_pass() -> None:
    alg = SameEveryIteration(num_iterations=3)
    rl = local_rl(tiny_model("llada"), alg, reward=text_reward, lr=5e-2, grad_clip=0.0)
    prompts, answers, groups = rl.prompts(0).expanded()
    from dllm_train import sample_seeds

    rl.rank.rollout_step(0, prompts, answers, sample_seeds(0, len(prompts), "rollout", 0), groups)
    prepared = rl.rank.prepared
    assert prepared is not None and prepared.old is not None
    # one pass (whose scorer calls may be replayed) serves every iteration
    assert alg.calls and set(alg.calls) == {0} and len(prepared.old) == 3
    assert all(v is prepared.old[0] for v in prepared.old)
    metrics = rl.actor.update(prepared, torch.zeros(len(prompts)))
    assert metrics["optimizer_steps"] == COPIES * 3
