"""The output head only where scored: every block-family algorithm (BGPO, EBPO, CJ-GRPO) gets the
same loss and gradients when the scorer computes log-probs at the noised positions of the noisy
copies alone (`Scorer(noised_only=True)`, the default) as when it scores every position of a
noised block, on tiny float64 SDAR and LLaDA2 models, on packed shared-clean rows and on the
padded path; and on packed rows the head runs on exactly the noised tokens (none of x_0)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import dllm_models.logprob as logprob
from dllm_train import Scorer
from tests.dllm_algorithms.cases import ALGORITHMS, prepared_batch
from tests.dllm_algorithms.test_microbatch import _reference
from tests.tiny_rl import tiny_model

BLOCK_ALGORITHMS = sorted(n for n, a in ALGORITHMS.items() if "sdar" in a.families)
CASES = [(n, f, a) for n in BLOCK_ALGORITHMS for f in ("sdar", "llada2") for a in ("sdpa", "none")]


@pytest.mark.parametrize(("name", "family", "attention"), CASES, ids=[f"{n}-{f}-{a}" for n, f, a in CASES])
def test_scoring_only_the_noised_positions_keeps_loss_and_gradients(name: str, family: str, attention: str) -> None:
    model = tiny_model(family, dtype=torch.float64)
    rl, prepared, advantages = prepared_batch(name, family, model, train_attention=attention)
    alg = ALGORITHMS[name]
    packed = None if attention == "none" else attention
    rl.actor.scorer = Scorer(model, attention=packed, noised_only=False)
    want_loss, want = _reference(alg, rl, prepared, advantages)
    rl.actor.scorer = Scorer(model, attention=packed, noised_only=True)
    got_loss, got = _reference(alg, rl, prepared, advantages)
    scale = max(float(g.abs().max()) for g in want.values())
    assert scale > 0 and got.keys() == want.keys()
    assert got_loss == pytest.approx(want_loss, rel=1e-12, abs=1e-12)
    gap = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert gap <= 1e-12 * scale, (gap, scale)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_the_head_runs_on_the_noised_tokens_only(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(family, dtype=torch.float64)
    bl = model.traits.block_length
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 12, (2, 3 * bl + 1), generator=g).repeat_interleave(3, 0)  # 3 copies each
    noised = torch.rand(clean.shape, generator=g) < 0.4
    noisy = torch.where(noised, torch.full_like(clean, model.traits.mask_token_id), clean)
    attn = torch.ones_like(clean, dtype=torch.bool)
    rows: list[int] = []
    real = logprob.token_logprobs

    def counting(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows.append(hidden.shape[0])
        return real(hidden, *args, **kwargs)

    monkeypatch.setattr(logprob, "token_logprobs", counting)
    every = Scorer(model, attention="sdpa", noised_only=False)(noisy, attn, clean)
    only = Scorer(model, attention="sdpa")(noisy, attn, clean)
    # the head ran on every noisy-copy token of a noised block, then on the noised tokens alone
    assert rows[1] == int(noised.sum()) < rows[0] <= clean.numel()
    torch.testing.assert_close(only, torch.where(noised, every, torch.zeros_like(every)), rtol=0, atol=0)
    assert bool((every[~noised] != 0).any())  # what is no longer computed was not zero
