"""The shared-clean BD3LM layout (`dllm_train.packed_scoring`): the Monte-Carlo copies of a block-
family sequence share one clean half, [x_0 ; x_t^1 ; ... ; x_t^k], and compute exactly what the
doubled layout ([x_t ; x_0] per copy) computes, in float64: hidden states of every noisy copy,
log-probs and gradients; no copy sees another; the token budget prices what each forward runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_models import final_hidden
from dllm_models.packing import pack
from dllm_objectives import iid_masks
from dllm_train import Scorer, TrainerConfig, plan_token_logp
from dllm_train.packed_scoring import bd3lm_layout, shares_clean_context
from dllm_train.passes import forward_outputs, split, trace
from tests.tiny_rl import tiny_model

BLOCK_FAMILIES = ["sdar", "llada2", "sdar_moe"]
LENGTHS = [9, 4, 12]
COPIES = 4


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Left-padded rows of 9, 4 and 12 tokens, and 4 iid masks of their last 6 positions each."""
    g = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    ids = torch.randint(0, 12, (len(LENGTHS), width), generator=g)
    attn = torch.zeros(len(LENGTHS), width, dtype=torch.bool)
    for i, n in enumerate(LENGTHS):
        attn[i, width - n:] = True
    target = attn.clone()
    target[:, :-6] = False
    return ids, attn, iid_masks(target, COPIES, generator=g)


def _rows(model: Any, ids: torch.Tensor, attn: torch.Tensor, plan: Any) -> tuple[torch.Tensor, ...]:
    """(noisy, attention, clean) rows [3 * COPIES, S] as `plan_token_logp` builds them."""
    noisy = torch.where(plan.mask, model.traits.mask_token_id, ids[:, None]).flatten(0, 1)
    return noisy, attn.repeat_interleave(COPIES, 0), ids.repeat_interleave(COPIES, 0)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def test_rows_of_one_clean_sequence_are_grouped() -> None:
    ids, attn, plan = _batch()
    model = tiny_model("sdar")
    noisy, rows_attn, clean = _rows(model, ids, attn, plan)
    follows = shares_clean_context(rows_attn, clean)
    assert follows.tolist() == [False, True, True, True] * len(LENGTHS)
    # the same tokens at other real positions, or another token, start a new group
    other = clean.clone()
    other[5, -1] += 1
    assert shares_clean_context(rows_attn, other).tolist()[4:8] == [False, False, False, True]
    shifted = rows_attn.clone()
    shifted[2] = torch.roll(shifted[2], 1)
    assert shares_clean_context(shifted, clean).tolist()[1:4] == [True, False, False]
    # an empty row never joins a group
    empty = rows_attn.clone()
    empty[1:3] = False
    assert shares_clean_context(empty, clean).tolist()[:4] == [False, False, False, False]


def _kept_by_hand(noisy: torch.Tensor, attn: torch.Tensor, clean: torch.Tensor, block: int) -> list[int]:
    """Per row: its real tokens in the blocks (of `block` positions from its first real token)
    that hold a noised token of the row, counted with Python loops."""
    out = []
    for r in range(noisy.shape[0]):
        real = attn[r].nonzero()[:, 0].tolist()
        blocks = [real[i:i + block] for i in range(0, len(real), block)]
        out.append(sum(len(b) for b in blocks if any(int(noisy[r, j]) != int(clean[r, j]) for j in b)))
    return out


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_every_noisy_copy_has_the_doubled_layouts_hidden_states_and_gradients(family: str) -> None:
    """float64 final hidden states of each noisy copy's noised blocks, and the gradient of a random
    function of them, are the same in four layouts: shared or doubled clean copies, noisy copies
    whole or carrying only their noised blocks; token counts: (k + 1) L, 2 k L, and the noised
    blocks' tokens in place of k L."""
    model = tiny_model(family, dtype=torch.float64).train()
    ids, attn, plan = _batch()
    noisy, rows_attn, clean = _rows(model, ids, attn, plan)
    packed = pack(noisy, rows_attn)
    block = model.traits.block_length
    kept_rows = _kept_by_hand(noisy, rows_attn, clean, block)
    assert 0 < sum(kept_rows) < sum(COPIES * n for n in LENGTHS)  # some blocks are dropped, some kept
    weights = torch.randn(packed.num_tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(5),
                          dtype=torch.float64)
    # the noised blocks' tokens, by hand: the only hidden states any score reads
    block_of = (packed.position_ids[0] // block)
    row_of = torch.repeat_interleave(torch.arange(noisy.shape[0]), rows_attn.sum(-1))
    changed = packed.input_ids[0] != clean[rows_attn]
    read = torch.tensor([bool(changed[(row_of == r) & (block_of == b)].any()) for r, b in zip(row_of, block_of)])
    out = {}
    for name, follows in (("shared", shares_clean_context(rows_attn, clean)),
                          ("doubled", torch.zeros(noisy.shape[0], dtype=torch.bool))):
        for sparse in (True, False):
            layout = bd3lm_layout(packed, clean, follows, block, noised_blocks_only=sparse)
            assert torch.equal(layout.noisy_at >= 0, read if sparse else torch.ones_like(read))
            model.zero_grad(set_to_none=True)
            hidden = final_hidden(model, layout.input_ids, attention=layout.attention, position_ids=layout.position_ids,
                                  attention_backend="sdpa")[0, layout.noisy_at.clamp(min=0)]
            hidden = torch.where(read[:, None], hidden, torch.zeros_like(hidden))
            (hidden * weights).sum().backward()
            out[name, sparse] = (layout.input_ids.shape[1], hidden.detach(), _grads(model))
    assert out["shared", False][0] == sum((COPIES + 1) * n for n in LENGTHS)
    assert out["doubled", False][0] == sum(2 * COPIES * n for n in LENGTHS)
    assert out["shared", True][0] == sum(LENGTHS) + sum(kept_rows)
    assert out["doubled", True][0] == sum(COPIES * n for n in LENGTHS) + sum(kept_rows)
    ref = out["doubled", False]
    # the families normalise (RMSNorm) and rotate (RoPE) in float32 whatever the model's dtype: a
    # norm weight's gradient sums float32 terms over the layout's tokens, so the layouts (one
    # clean half, or k of them) round it differently at ~1e-7; a leak between copies is O(1)
    scale = max(float(g.abs().max()) for g in ref[2])
    assert scale > 0
    for key in (("shared", True), ("doubled", True), ("shared", False)):
        torch.testing.assert_close(out[key][1], ref[1], rtol=1e-10, atol=1e-10)
        for a, b in zip(out[key][2], ref[2]):
            assert float((a - b).abs().max()) <= 1e-6 * scale


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_scorer_log_probs_and_gradients_equal_the_doubled_layout(family: str) -> None:
    """Through `Scorer` (fused float32 log-prob head): the per-copy log-probs and the gradients of
    a loss over them agree with the doubled layout and with the padded path; flex (CPU, values)."""
    model = tiny_model(family, dtype=torch.float64).train()
    ids, attn, plan = _batch()

    def run(scorer: Scorer, grads: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grads):
            lp = plan_token_logp(scorer, ids, attn, plan, temperature=0.7)
        if grads:
            torch.exp(lp.clamp(max=0)).sum().backward()
        return lp.detach(), _grads(model)

    ref, ref_grads = run(Scorer(model, attention="sdpa", shared_context=False))
    scale = max(float(g.abs().max()) for g in ref_grads)
    for scorer in (Scorer(model, attention="sdpa"), Scorer(model)):
        got, got_grads = run(scorer)
        torch.testing.assert_close(got.double(), ref.double(), rtol=1e-6, atol=1e-6)  # padded: float64
        for a, b in zip(got_grads, ref_grads):
            assert float((a - b).abs().max()) <= 1e-5 * scale
    with torch.no_grad():
        flex = run(Scorer(model.eval(), attention="flex"), grads=False)[0]
    torch.testing.assert_close(flex, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_no_noisy_copy_sees_another(family: str) -> None:
    """Changing the noise of one copy changes its own log-probs and no other copy's."""
    model = tiny_model(family, dtype=torch.float64).eval()
    ids, attn, plan = _batch()
    noisy, rows_attn, clean = _rows(model, ids, attn, plan)
    scorer = Scorer(model, attention="sdpa")
    changed = noisy.clone()
    real = rows_attn[1].nonzero()[:, 0]
    changed[1, real[-6:]] = model.traits.mask_token_id  # copy 2 of sequence 1: its whole tail masked
    changed[1, real[-1]] = clean[1, real[-1]]
    with torch.no_grad():
        before = scorer(noisy, rows_attn, clean)
        after = scorer(changed, rows_attn, clean)
    assert bool(shares_clean_context(rows_attn, clean)[1:4].all())  # the copies did share one clean half
    others = [r for r in range(noisy.shape[0]) if r != 1]
    torch.testing.assert_close(after[others], before[others], rtol=0, atol=1e-12)
    assert float((after[1] - before[1]).abs().max()) > 1e-3


def _forward_tokens(model: Any) -> tuple[list[int], Any]:
    """A list that receives the length of every forward's input, and the hook's handle."""
    seen: list[int] = []
    handle = model.model.embed_tokens.register_forward_pre_hook(lambda _m, args: seen.append(args[0].numel()))
    return seen, handle


@pytest.mark.parametrize("layout", ["shared", "doubled"])
def test_the_budget_prices_what_each_forward_runs(layout: str) -> None:
    """Every pass runs exactly its priced tokens (counted at the model's embedding), within the
    budget unless it is one row; a group of copies split over passes pays one clean half per
    pass; a row costs its clean copy plus its noised blocks' tokens (counted by hand); one pass:
    L + the copies' noised blocks per sequence (shared), k L + them (doubled)."""
    model = tiny_model("sdar", dtype=torch.float64).eval()
    scorer = Scorer(model, attention="sdpa", shared_context=layout == "shared")
    ids, attn, plan = _batch()
    calls = trace(lambda s: plan_token_logp(s, ids, attn, plan), scorer)
    call = calls[0]
    cost = scorer.row_cost(call.noisy, call.attention, call.targets).tolist()
    shared = scorer.shared_tokens(call.noisy, call.attention, call.targets).tolist()
    kept = _kept_by_hand(call.noisy, call.attention, call.targets, model.traits.block_length)
    assert 0 < sum(kept) < sum(COPIES * n for n in LENGTHS)
    assert cost == [n + k for n, k in zip([n for n in LENGTHS for _ in range(COPIES)], kept)]
    assert shared == ([n * (c > 0) for n in LENGTHS for c in range(COPIES)] if layout == "shared"
                      else [0] * len(cost))
    for budget in (1, 30, 60, 0):
        seen, handle = _forward_tokens(model)
        try:
            forward_outputs(calls, scorer, budget)
        finally:
            handle.remove()
        passes = split(calls, scorer, budget)
        priced = [sum(cost[r] for r in p.rows.tolist()) - sum(shared[r] for r in p.rows.tolist()[1:])
                  for p in passes]
        assert seen == priced, (budget, seen, priced)
        assert all(t <= budget or len(p.rows) == 1 for t, p in zip(priced, passes)) or budget == 0
        if budget == 0:
            clean_copies = 1 if layout == "shared" else COPIES
            assert seen == [clean_copies * sum(LENGTHS) + sum(kept)]


def test_the_layout_is_a_validated_trainer_field_that_reaches_every_scorer() -> None:
    from dllm_algorithms import BGPO
    from tests.tiny_rl import local_rl

    assert TrainerConfig().bd3lm_layout == "shared"
    with pytest.raises(ValueError, match="trainer.bd3lm_layout='tripled'"):
        TrainerConfig(bd3lm_layout="tripled")
    for layout in ("shared", "doubled"):
        rl = local_rl(tiny_model("sdar"), BGPO(mc_num=2), train_attention="sdpa", bd3lm_layout=layout)
        assert rl.actor.scorer.shared_context == (layout == "shared")


def test_a_group_that_must_split_pays_the_fewest_clean_halves() -> None:
    """16 copies of each of 3 sequences of 10 tokens, 70 tokens per pass (a clean half and 6
    copies): every group takes ceil(16 / 6) = 3 passes, 3 clean halves, where filling each pass
    row by row would start groups in the tail of a pass and pay 4 for some."""
    model = tiny_model("sdar")
    scorer = Scorer(model, attention="sdpa")
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, 12, (3, 10), generator=g)
    rows = seqs.repeat_interleave(16, 0)
    noisy = rows.clone()
    noisy[:, 1::4] = model.traits.mask_token_id  # a noised token in each block of 4: every copy whole
    attn = torch.ones_like(rows, dtype=torch.bool)
    from dllm_train.passes import ScoreCall

    call = ScoreCall(noisy, attn, rows, None, 1.0)
    passes = split([call], scorer, 70)
    assert torch.cat([p.rows for p in passes]).tolist() == list(range(48))
    cost = scorer.row_cost(noisy, attn, rows)
    saved = scorer.shared_tokens(noisy, attn, rows)
    priced = [int(cost[p.rows].sum() - saved[p.rows][1:].sum()) for p in passes]
    assert max(priced) <= 70
    clean_halves = sum(1 + int((saved[p.rows][1:] == 0).sum()) for p in passes)
    assert clean_halves == 9 and len(passes) == 9, (clean_halves, [p.rows.tolist() for p in passes])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flex", "bd3lm_kernel"])
@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_shared_clean_layout_on_compiled_flex_on_gpu(family: str, backend: str) -> None:
    """CUDA, compiled flex and the BD3LM Triton kernel (the GPU default for block families),
    float32: shared equals doubled."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = tiny_model(family).cuda().train()
    ids, attn, plan = _batch()
    ids, attn = ids.cuda(), attn.cuda()
    plan = type(plan)(mask=plan.mask.cuda(), p_mask=plan.p_mask.cuda(), meta=plan.meta)

    def run(shared: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        lp = plan_token_logp(Scorer(model, attention=backend, shared_context=shared), ids, attn, plan)
        torch.exp(lp.clamp(max=0)).sum().backward()
        return lp.detach(), _grads(model)

    (got, got_grads), (ref, ref_grads) = run(True), run(False)
    torch.testing.assert_close(got, ref, rtol=5e-3, atol=5e-3)  # Triton float32 dots run in TF32
    for a, b in zip(got_grads, ref_grads):
        cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)
        assert cos > 0.999 or (a.abs().max() < 1e-6 and b.abs().max() < 1e-6), float(cos)
