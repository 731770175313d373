"""Optimizer-state offload (`trainer.optimizer_offload`): the state waits in host memory with its
device storage freed, and the steps, checkpoints and RL runs are exactly those without it.

Without a GPU the tests count CPU tensors as device-resident (`devices=("cpu",)`), so their
storage is freed and comes back from a separate host buffer just as CUDA storage would.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from dllm_algorithms import BGPO
from dllm_train import LocalRL, OptimConfig
from dllm_train.offload import ALIGN_BYTES, HostOffload, state_tensors
from dllm_train.optim import OptimizerStep
from tests.dllm_train.distributed_helpers import run_ranks
from tests.tiny_rl import fast, local_rl, reproducible, tiny_model

CPU = ("cpu",)


def _model(dtype: torch.dtype = torch.float64, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dtype).to(device)


def _optim(model: torch.nn.Module, devices: tuple[str, ...] = CPU) -> OptimizerStep:
    opt = OptimizerStep(model, OptimConfig(lr=1e-2, weight_decay=0.1, grad_clip=0.5))
    opt.host.devices = devices
    return opt


def _train(opt: OptimizerStep, step: int, *, loss: float | None = None) -> dict[str, float]:
    """One step on a batch drawn from `step` (so two runs see the same data); `loss` overrides the loss read."""
    opt.zero_grad()
    p = next(opt.model.parameters())
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(step), dtype=p.dtype).to(p.device)
    out = opt.model(x).pow(2).sum()
    out.backward()
    return opt.step(out.detach() if loss is None else loss)


def _same(a: OptimizerStep, b: OptimizerStep) -> None:
    """Bit-identical weights and optimizer state."""
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        assert sa[k].keys() == sb[k].keys()
        for name in sa[k]:
            assert torch.equal(sa[k][name], sb[k][name]), (k, name)


def test_offload_frees_the_storage_and_restore_brings_back_the_same_tensors() -> None:
    opt = _optim(_model())
    for step in range(2):
        _train(opt, step)
    tensors = state_tensors(opt.optimizer)
    values = [t.clone() for t in tensors]
    ids = [id(t) for t in tensors]
    opt.offload()
    assert opt.host.offloaded
    assert all(t.untyped_storage().nbytes() == 0 for t in state_tensors(opt.optimizer))
    assert all(s.offset % ALIGN_BYTES == 0 for s in opt.host.slots)
    opt.restore()
    assert not opt.host.offloaded
    assert [id(t) for t in state_tensors(opt.optimizer)] == ids  # the state dict holds the same objects
    for t, v in zip(state_tensors(opt.optimizer), values, strict=True):
        assert torch.equal(t, v)


def test_views_and_shared_storage_move_once_and_come_back_exactly() -> None:
    base = torch.arange(10, dtype=torch.float32)
    view = base[3:7]  # shares base's storage, at an offset
    other = torch.arange(5, dtype=torch.int64)
    host = HostOffload(devices=CPU)
    nbytes = base.untyped_storage().nbytes() + other.untyped_storage().nbytes()
    assert host.offload([base, view, other]) == nbytes
    assert len(host.slots) == 2 and view.untyped_storage().nbytes() == 0
    buffer = host.buffer
    host.restore()
    assert torch.equal(view, torch.tensor([3.0, 4.0, 5.0, 6.0])) and torch.equal(other, torch.arange(5))
    host.offload([base, view, other])
    assert host.buffer is buffer  # the same layout reuses the buffer
    host.restore()
    host.offload([other])
    assert host.buffer is not buffer  # a new layout gets its own
    host.restore()


def test_only_tensors_on_the_offload_devices_move() -> None:
    opt = _optim(_model(), devices=("cuda",))  # production's default: AdamW's CPU state stays put
    _train(opt, 0)
    opt.offload()
    assert not opt.host.offloaded
    assert all(t.untyped_storage().nbytes() > 0 for t in state_tensors(opt.optimizer))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_steps_with_offload_between_them_equal_steps_without(dtype: torch.dtype) -> None:
    plain, parked = _optim(_model(dtype)), _optim(_model(dtype))
    for step in range(5):
        _train(plain, step)
        _train(parked, step)
        parked.offload()
        parked.offload()  # idempotent
        assert parked.host.offloaded
    assert parked.restore_s > 0.0
    parked.restore()
    _same(plain, parked)


def test_state_while_offloaded_is_the_restored_state() -> None:
    plain, parked = _optim(_model()), _optim(_model())
    for step in range(3):
        _train(plain, step)
        _train(parked, step)
    parked.offload()
    got = copy.deepcopy(parked.state())
    want = plain.state()
    assert not parked.host.offloaded
    assert (got["updates"], got["skipped"]) == (want["updates"], want["skipped"])
    for k, s in want["optimizer"]["state"].items():
        for name, v in s.items():
            assert torch.equal(got["optimizer"]["state"][k][name], v)


def test_load_state_while_offloaded_then_steps_match() -> None:
    source = _optim(_model())
    for step in range(3):
        _train(source, step)
    checkpoint = copy.deepcopy(source.state())
    target = _optim(copy.deepcopy(source.model))
    for step in range(10, 12):  # a different history, then offloaded
        _train(target, step)
    target.offload()
    target.model.load_state_dict(source.model.state_dict())  # a resume loads the weights too
    target.load_state(checkpoint)
    assert not target.host.offloaded  # no slot left pointing at the replaced tensors
    for step in range(3, 6):
        _train(source, step)
        _train(target, step)
        target.offload()
    target.restore()
    _same(source, target)


def test_a_step_after_a_skipped_one_restores_and_matches() -> None:
    plain, parked = _optim(_model()), _optim(_model())
    for opt in (plain, parked):
        _train(opt, 0)
    parked.offload()
    for opt in (plain, parked):
        assert _train(opt, 1, loss=float("nan"))["skipped"] == 1.0
    assert parked.host.offloaded  # the skipped step did not read the state
    for opt in (plain, parked):
        assert _train(opt, 2)["optimizer_steps"] == 1.0
    assert not parked.host.offloaded
    _same(plain, parked)


def _rl(offload: bool) -> LocalRL:
    wf = local_rl(tiny_model("llada"), fast(BGPO()), optimizer_offload=offload)
    wf.rank.actor.optim.host.devices = CPU
    return wf


def test_the_rollout_runs_with_the_optimizer_state_offloaded() -> None:
    """`trainer.optimizer_offload` through `LocalRL` (the rank assembly): the second step's rollout
    sees the AdamW state's storage freed (the first has no state yet), and both steps' results
    and weights equal those of a run without offload."""
    wf, plain = _rl(True), _rl(False)
    assert wf.rank.actor.optimizer_offload and not plain.rank.actor.optimizer_offload
    rollout = wf.rank.rollout
    generate = rollout.generate
    seen: list[tuple[bool, bool]] = []

    def spy(prompts, seeds):  # type: ignore[no-untyped-def]
        tensors = state_tensors(wf.rank.actor.optimizer)
        seen.append((bool(tensors), all(t.untyped_storage().nbytes() == 0 for t in tensors)))
        return generate(prompts, seeds)

    rollout.generate = spy  # type: ignore[method-assign]
    for step in range(2):
        metrics, want = wf.step(step), plain.step(step)
        assert reproducible(metrics) == reproducible(want)
        assert metrics["optimizer_offload_s"] >= 0.0 and metrics["optimizer_restore_s"] >= 0.0
        assert "optimizer_offload_s" not in want and "optimizer_restore_s" not in want
    assert seen == [(False, True), (True, True)]
    assert not wf.rank.actor.optim.host.offloaded  # the update restored it
    for p, q in zip(wf.rank.actor.model.parameters(), plain.rank.actor.model.parameters(), strict=True):
        assert torch.equal(p, q)


def _fsdp_ranks(rank: int) -> dict[str, Any]:
    """Two RL steps on a Ray-style rank (FSDP2 actor, DTensor optimizer state) with and without
    offload; with it, a checkpoint of shards is written while the state is offloaded."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    import torch.distributed as dist

    from dllm_algorithms import D1
    from dllm_train import sample_seeds
    from dllm_train.distributed import RankWorker, full_state_dict
    from tests.dllm_train.distributed_helpers import algorithm_rank_setup
    from tests.tiny_rl import addition_prompts

    out: dict[str, Any] = {}
    for offload in (False, True):
        worker = RankWorker(algorithm_rank_setup("llada", D1(), optimizer_offload=offload))
        worker.actor.optim.host.devices = CPU
        freed = []
        for step in range(2):
            prompts, answers, groups = addition_prompts(2, 4)(step).expanded()
            seeds = sample_seeds(0, len(prompts), "rollout", step)
            rows = slice(4 * rank, 4 * rank + 4)
            worker.rollout_step(step, prompts[rows], answers[rows], seeds[rows], groups[rows])
            local = state_tensors(worker.actor.optimizer)
            freed.append(bool(local) and all(t.untyped_storage().nbytes() == 0 for t in local))
            if offload and step == 1:
                folder = Path(tempfile.gettempdir()) / f"offload-shards-{os.getppid()}"  # the ranks' parent
                worker.save_shards(str(folder))  # a collective
                freed.append(worker.actor.optim.host.offloaded)
                dist.barrier()
                if rank == 0:
                    shutil.rmtree(folder)
            worker.update(torch.linspace(-1.0, 1.0, 4))
        out[str(offload)] = {"freed": freed, "weights": full_state_dict(worker.model, cpu=True)}
    return out


@pytest.mark.slow
def test_fsdp_ranks_offload_their_shards_and_train_the_same() -> None:
    for res in run_ranks(_fsdp_ranks):
        assert res["False"]["freed"] == [False, False]
        assert res["True"]["freed"] == [False, True, False]  # saving shards restored the state
        if res["True"]["weights"]:  # rank 0 holds the gathered weights
            for k, v in res["False"]["weights"].items():
                assert torch.equal(res["True"]["weights"][k], v), k


@pytest.mark.gpu
def test_cuda_offload_frees_the_state_and_the_next_step_is_unchanged() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    plain, parked = _optim(_model(torch.float32, "cuda"), ("cuda",)), _optim(_model(torch.float32, "cuda"), ("cuda",))
    for opt in (plain, parked):
        _train(opt, 0)
    state_bytes = sum(t.untyped_storage().nbytes() for t in state_tensors(parked.optimizer) if t.is_cuda)
    assert state_bytes > 0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    parked.offload()
    assert before - torch.cuda.memory_allocated() >= state_bytes
    assert parked.host.buffer is not None and parked.host.buffer.is_pinned()
    for opt in (plain, parked):
        _train(opt, 1)
    _same(plain, parked)


def test_the_value_model_and_the_policy_never_hold_their_optimizer_states_together() -> None:
    """With a value model (TraceRL's critic) and `trainer.optimizer_offload`, the policy's AdamW state
    waits in host memory while the value model trains, and the value model's while the policy
    trains and decodes; the steps' results and both models' weights equal a run without offload."""
    from dllm_algorithms import TraceRL
    from dllm_rollout import SamplingConfig
    from tests.tiny_rl import text_reward

    sampling = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, temperature=1.0)

    def rl(offload: bool) -> LocalRL:
        alg = TraceRL(value_model=True, min_group_accuracy=0.0, max_group_accuracy=1.0, value_lr=1e-3)
        wf = local_rl(tiny_model("sdar"), alg, sampling=sampling, reward=text_reward, optimizer_offload=offload)
        critic = wf.rank.critic
        assert critic is not None
        wf.rank.actor.optim.host.devices = CPU
        critic.optim.host.devices = CPU
        return wf

    def freed(optim: OptimizerStep) -> tuple[bool, bool]:  # (has a state, every storage freed)
        tensors = state_tensors(optim.optimizer)
        return bool(tensors), all(t.untyped_storage().nbytes() == 0 for t in tensors)

    wf, plain = rl(True), rl(False)
    critic, actor = wf.rank.critic, wf.rank.actor
    assert critic is not None and critic.optimizer_offload
    seen: dict[str, list[tuple[bool, bool]]] = {"policy update: value state freed": [], "value update: policy state freed": []}
    actor_update, critic_update = actor.update, critic.update

    def spy_actor(*a: Any, **k: Any) -> Any:
        seen["policy update: value state freed"].append(freed(critic.optim))
        return actor_update(*a, **k)

    def spy_critic(*a: Any, **k: Any) -> Any:
        seen["value update: policy state freed"].append(freed(actor.optim))
        return critic_update(*a, **k)

    actor.update = spy_actor  # type: ignore[method-assign]
    critic.update = spy_critic  # type: ignore[method-assign]
    for step in range(3):
        metrics, want = wf.step(step), plain.step(step)
        assert reproducible(metrics) == reproducible(want)
        assert metrics["value_optimizer_steps"] == 1.0 and metrics["value_grad_norm"] > 0
    # the value model's first update makes its state (none to free at the first policy update); the
    # policy's exists from its first update on; each waits off the device while the other trains
    assert seen == {"policy update: value state freed": [(False, True), (True, True), (True, True)],
                    "value update: policy state freed": [(True, True), (True, True), (True, True)]}
    assert actor.optim.host.offloaded and not critic.optim.host.offloaded  # the value step restored its own
    plain_critic = plain.rank.critic
    assert plain_critic is not None
    for a, b in ((actor.model, plain.rank.actor.model), (critic.model, plain_critic.model)):
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(p, q)
