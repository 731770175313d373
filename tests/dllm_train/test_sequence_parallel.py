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

