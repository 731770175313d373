"""Token-budget passes (`dllm_train.passes`): the split respects the budget, every row cost is
what its forward runs, and the accumulated gradients equal one forward over the whole batch,
for row-local losses and for losses that couple rows (where the row-local shortcut would be
wrong: the flag matters)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_objectives import iid_masks
from dllm_train import Scorer, accumulate, evaluate, plan_token_logp
from dllm_train.passes import split, trace
from tests.tiny_rl import tiny_model

LENGTHS = [9, 4, 12, 7, 12, 3]


def _batch(family: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Left-padded rows of different lengths, and 3 iid masks of their last 5 positions each."""
    g = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    ids = torch.randint(0, 12, (len(LENGTHS), width), generator=g)
    attn = torch.zeros(len(LENGTHS), width, dtype=torch.bool)
    for i, n in enumerate(LENGTHS):
        attn[i, width - n:] = True
    target = attn.clone()
    target[:, :-5] = False
    return ids, attn, iid_masks(target, 3, generator=g)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _coupled_loss(v: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # the square of a sum over all rows: every row's gradient depends on every other row's value
    return v.sum().pow(2) * 1e-3, {"total": v.sum().detach()}


def _local_loss(v: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # a sum of per-row nonlinear terms
    return torch.exp(v.clamp(max=0)).sum(), {}


@pytest.mark.parametrize("family", ["llada", "sdar"])
@pytest.mark.parametrize("attention", [None, "sdpa"])
def test_accumulated_gradients_equal_one_forward(family: str, attention: str | None) -> None:
    model = tiny_model(family, dtype=torch.float64).train()
    scorer = Scorer(model, attention=attention)
    ids, attn, plan = _batch(family)

    def values(s: Any) -> torch.Tensor:
        return plan_token_logp(s, ids, attn, plan)

    for loss_fn, row_local in ((_coupled_loss, False), (_local_loss, True)):
        model.zero_grad(set_to_none=True)
        loss = loss_fn(values(scorer))[0]
        loss.backward()
        want_loss = float(loss.detach())
        want = _grads(model)
        for budget in (1, 30, 0):
            model.zero_grad(set_to_none=True)
            result = accumulate(values, loss_fn, scorer, max_tokens=budget, row_local=row_local)
            got = _grads(model)
            scale = max(float(g.abs().max()) for g in want.values())
            assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-6 * scale, (budget, row_local)
            assert float(result.loss) == pytest.approx(want_loss, rel=1e-6)


def test_the_row_local_shortcut_is_wrong_for_a_loss_that_couples_rows() -> None:
    model = tiny_model("llada", dtype=torch.float64).train()
    scorer = Scorer(model)
    ids, attn, plan = _batch("llada")

    def values(s: Any) -> torch.Tensor:
        return plan_token_logp(s, ids, attn, plan)

    _coupled_loss(values(scorer))[0].backward()
    want = _grads(model)
    model.zero_grad(set_to_none=True)
    accumulate(values, _coupled_loss, scorer, max_tokens=1, row_local=True)
    got = _grads(model)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) > 1e-3 * max(float(g.abs().max()) for g in want.values())


def test_passes_respect_the_budget_and_cover_every_row_once() -> None:
    model = tiny_model("llada")
    scorer = Scorer(model, attention="sdpa")
    ids, attn, plan = _batch("llada")
    calls = trace(lambda s: plan_token_logp(s, ids, attn, plan), scorer)
    assert len(calls) == 1 and calls[0].noisy.shape[0] == len(LENGTHS) * 3
    cost = scorer.row_cost(calls[0].noisy, calls[0].attention).tolist()
    assert cost == [n for n in LENGTHS for _ in range(3)]  # packed rows cost their real tokens
    for budget in (1, 12, 25, 1000):
        passes = split(calls, scorer, budget)
        rows = torch.cat([p.rows for p in passes]).tolist()
        assert rows == list(range(len(cost)))
        for p in passes:
            total = sum(cost[r] for r in p.rows.tolist())
            assert total <= budget or len(p.rows) == 1, (budget, total)
    assert len(split(calls, scorer, 0)) == 1


def test_row_costs_of_the_padded_and_block_layouts() -> None:
    ids, attn, plan = _batch("sdar")
    noisy = torch.where(plan.mask[:, 0], 99, ids)
    width = ids.shape[1]
    padded = Scorer(tiny_model("llada"))
    assert padded.row_cost(noisy, attn).tolist() == [width] * len(LENGTHS)
    packed_block = Scorer(tiny_model("sdar"), attention="sdpa")
    packed_costs = packed_block.row_cost(noisy, attn, ids).tolist()
    assert packed_block.row_cost(noisy, attn).tolist() == [2 * n for n in LENGTHS]  # no clean ids: [x_t ; x_0]
    padded_block = Scorer(tiny_model("sdar"))
    costs = padded_block.row_cost(noisy, attn, ids).tolist()
    block = padded_block.block_length
    assert block is not None
    for i, n in enumerate(LENGTHS):  # one row per block holding a noised token of the row
        pos = (attn[i].long().cumsum(0) - 1).clamp(min=0)
        noised_blocks = {int(p) // block for p, changed in zip(pos, noisy[i] != ids[i]) if changed}
        assert costs[i] == width * max(1, len(noised_blocks))
        # packed [x_0 ; x_t]: the clean copy whole, the noisy copy's noised blocks only
        in_noised = sum(1 for p, real in zip(pos, attn[i]) if real and int(p) // block in noised_blocks)
        assert packed_costs[i] == n + in_noised


@pytest.mark.parametrize("attention", [None, "sdpa"])
def test_a_block_row_scores_the_same_alone_and_in_a_batch(attention: str | None) -> None:
    model = tiny_model("sdar", dtype=torch.float64).eval()
    scorer = Scorer(model, attention=attention)
    ids, attn, plan = _batch("sdar")
    noisy = torch.where(plan.mask[:, 0], model.traits.mask_token_id, ids)
    with torch.no_grad():
        whole = scorer(noisy, attn, ids)
        for i in range(len(LENGTHS)):
            alone = scorer(noisy[i:i + 1], attn[i:i + 1], ids[i:i + 1])
            torch.testing.assert_close(alone[0], whole[i], rtol=1e-9, atol=1e-9)


def test_evaluate_runs_no_grad_passes_and_returns_the_raw_outputs() -> None:
    model = tiny_model("llada", dtype=torch.float64)
    scorer = Scorer(model)
    ids, attn, plan = _batch("llada")

    def values(s: Any) -> torch.Tensor:
        return plan_token_logp(s, ids, attn, plan).sum(-1)

    got, raw = evaluate(values, scorer, 1)
    assert not got.requires_grad and len(raw) == 1 and raw[0].shape == (len(LENGTHS) * 3, ids.shape[1])
    with torch.no_grad():
        torch.testing.assert_close(got, values(scorer), rtol=1e-9, atol=1e-9)


def test_every_worker_refuses_a_negative_token_budget() -> None:
    """The actor, the reference and the offline worker check `max_tokens_per_pass` the same way."""
    from dllm_algorithms import D1, DPO
    from dllm_train import ActorWorker, OfflineWorker, OptimConfig, ReferenceWorker
    from tests.dllm_train.helpers import preference_pairs

    model = tiny_model("llada")
    optim = OptimConfig(lr=1e-3)
    workers = [
        lambda: ActorWorker(model, D1(), optim, max_tokens_per_pass=-1),
        lambda: ReferenceWorker(model, max_tokens_per_pass=-1, freeze=False),
        lambda: OfflineWorker(model, DPO(), preference_pairs, optim, seed=0, ref_model=model, max_tokens_per_pass=-1),
    ]
    for make in workers:
        with pytest.raises(ValueError, match=r"max_tokens_per_pass must be >= 0 \(0: no limit\), got -1"):
            make()


class _Priced:
    """A stand-in scorer whose rows cost `cost` and share `shared` tokens (only what `split` reads)."""

    def __init__(self, cost: list[int], shared: list[int]) -> None:
        self.cost, self.shared = torch.tensor(cost), torch.tensor(shared)

    def row_cost(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor,
                 clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.cost

    def shared_tokens(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor,
                      clean_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.shared


def test_a_group_of_unequal_copies_starts_where_it_pays_fewer_clean_halves() -> None:
    """Copies that carry only their noised blocks cost unequally: a lone row of 60 tokens, then a
    group with a clean half of 20 and copies of 5, 60, 5, 5, 5 tokens, at 100 per pass. Started
    after the lone row (85 tokens), the second copy (60) would need a new pass and the clean half
    again (85 + 95 = 180 tokens); started fresh the group fits one pass (60 + 100 = 160). Judged
    by its second copy alone (all copies costing 60) it would look the same either way."""
    from dllm_train.passes import ScoreCall

    cost, shared = [60, 25, 80, 25, 25, 25], [0, 0, 20, 20, 20, 20]
    rows = torch.zeros(len(cost), 4, dtype=torch.long)
    call = ScoreCall(rows, torch.ones_like(rows, dtype=torch.bool), rows, rows, 1.0)
    passes = split([call], _Priced(cost, shared), 100)  # type: ignore[arg-type]
    assert [p.rows.tolist() for p in passes] == [[0], [1, 2, 3, 4, 5]]
    priced = [sum(cost[r] for r in p.rows.tolist()) - sum(shared[r] for r in p.rows.tolist()[1:]) for p in passes]
    assert priced == [60, 100]
