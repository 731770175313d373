"""DPO / VRPO: loss log 2 at the reference with shared masks, and a step trains."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dare.algorithms import build_preference
from dllm_train import OptimConfig, PreferenceBatch, PreferenceWorker, derive_seed
from tests.dllm_train.algo_helpers import TASK, tiny_model


def _pairs(step: int) -> PreferenceBatch:
    ids, attn, resp = TASK.sft_batch(8, derive_seed(0, "pref", step))
    wrong = ids.clone()
    wrong[resp] = ids[resp].roll(1, 0)
    return PreferenceBatch(ids, attn, resp, wrong, attn, resp)


@pytest.mark.parametrize(("name", "family"), [("dpo", "llada"), ("vrpo", "llada"), ("vrpo", "dream")])
def test_preference_step(name: str, family: str) -> None:
    model = tiny_model(family)
    worker = PreferenceWorker(model, copy.deepcopy(model), _pairs, build_preference(name), OptimConfig(lr=1e-3), seed=0)
    if name == "vrpo":
        pc, pr, rc, rr = worker.values(0)
        assert torch.allclose(pc - pr, rc - rr, atol=1e-5)  # shared masks: logit exactly 0
    before = [p.detach().clone() for p in model.parameters()]
    m = worker.step(0)
    if name == "vrpo":
        assert abs(m["loss"] - math.log(2)) < 1e-4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
