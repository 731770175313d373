"""Memory peaks in the metrics of every phase: host RSS (`peak_rss_gib`) everywhere, CUDA on CUDA."""

from __future__ import annotations

import sys

import pytest
import torch

from dllm_algorithms import BGPO
from dllm_algorithms import SFT
from dllm_train import OptimConfig, SFTConfig
from dllm_train.metrics import device_peak, host_peak_gib, is_peak
from tests.dllm_train.helpers import sft_batch
from tests.tiny_rl import fast, local_rl, reproducible, tiny_model

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the resettable peak is Linux's VmHWM")


@linux
def test_host_peak_covers_the_interval_since_the_last_call() -> None:
    host_peak_gib()  # reset
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, then freed
    del block
    held = host_peak_gib()
    after = host_peak_gib()  # an interval in which nothing was allocated
    assert held is not None and after is not None
    assert held - after > 0.05  # the 64 MiB block counted in the first interval, not in the second


def test_an_rl_step_reports_the_peak_of_each_phase() -> None:
    wf = local_rl(tiny_model("sdar"), fast(BGPO()))
    metrics = wf.step(0)
    host = ["rollout_peak_rss_gib", "update_peak_rss_gib", "peak_rss_gib"]
    if sys.platform.startswith("linux"):
        assert all(metrics[k] > 0 for k in host)
        assert metrics["peak_rss_gib"] == max(metrics["rollout_peak_rss_gib"], metrics["update_peak_rss_gib"])
    device = ["rollout_peak_gib", "update_peak_gib", "peak_gib"]
    assert all((k in metrics) == torch.cuda.is_available() for k in device)
    assert not any(is_peak(k) for k in reproducible(metrics))  # reruns compare without them


def test_an_sft_step_reports_its_peak() -> None:
    model = tiny_model("llada")
    worker = SFT(sft=SFTConfig(steps=1, batch_size=4)).worker(model, lambda step: sft_batch(4, step),
                                                             OptimConfig(lr=1e-3), steps=1, seed=0)
    metrics = worker.step(0)
    assert ("peak_rss_gib" in metrics) == (host_peak_gib() is not None)
    assert set(device_peak()) <= {"peak_gib", "peak_rss_gib"}


def test_the_rollout_runs_without_the_last_updates_gradients() -> None:
    """The update's gradients are freed before the next rollout (a model's worth of memory at 8B),
    and the update recomputes them: the second step's rollout sees no parameter with a gradient."""
    wf = local_rl(tiny_model("llada"), fast(BGPO()))
    rollout = wf.rank.rollout
    generate = rollout.generate
    holding: list[bool] = []

    def spy(prompts, seeds):  # type: ignore[no-untyped-def]
        holding.append(any(p.grad is not None for p in wf.rank.actor.model.parameters()))
        return generate(prompts, seeds)

    rollout.generate = spy  # type: ignore[method-assign]
    wf.step(0)
    assert any(p.grad is not None for p in wf.rank.actor.model.parameters())  # the update made them
    wf.step(1)
    assert holding == [False, False]
