"""TraceRL's pure functions equal its authors' code (Gen-Verse/dLLM-RL at 10b4fd1) in float64.

Each `_dllmrl_*` function transcribes the authors' code it is compared with (file:line cited);
inputs are shared random step maps, log-probs, advantages and values.
"""

from __future__ import annotations

import pytest
import torch

from dllm_objectives import (
    block_ids,
    grpo_advantages,
    outcome_token_rewards,
    replay_plan,
    replay_rounds,
    shrink_steps,
    trace_group_filter,
    trace_policy_loss,
    trace_returns_and_advantages,
    trace_value_loss,
)

MASK = -7  # a stand-in mask id


# dLLM-RL: train/rl_sdar.py:219-231 at 10b4fd1
def _dllmrl_collapse_k_unique(lst: list[int], k: int) -> list[int]:
    uniq = sorted(set(lst))
    mapping = {}
    n = len(uniq)
    for idx, val in enumerate(uniq):
        group = idx // k
        end_idx = min((group + 1) * k - 1, n - 1)
        mapping[val] = uniq[end_idx]
    return [mapping[x] for x in lst]


# dLLM-RL: train/rl_sdar.py:516-522 at 10b4fd1 (shrink within each block of the response)
def _dllmrl_shrink_blocks(step_map: list[int], block_size: int, shrink: int) -> list[int]:
    out = list(step_map)
    l1 = len(out)
    for j in range(int((l1 - 1) / block_size) + 1):
        start, end = j * block_size, min(l1, (j + 1) * block_size)
        out[start:end] = _dllmrl_collapse_k_unique(out[start:end], shrink)
    return out


# dLLM-RL: train/rl_sdar.py:366-424 and :530-547 at 10b4fd1 (L0 = 0: the response alone)
def _dllmrl_sdar_rounds(ids: torch.Tensor, step_map: torch.Tensor, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    l1 = ids.shape[0]
    nb = (l1 + block_size - 1) // block_size
    step_b, rows = step_map.clone(), []
    while True:
        step_pad = torch.full((nb * block_size,), -1, dtype=torch.long)
        step_pad[:l1] = step_b
        step_blk = step_pad.view(nb, block_size)
        valid = step_blk.ge(0)
        tmp = step_blk.masked_fill(~valid, torch.iinfo(step_blk.dtype).max)
        min_vals, _ = tmp.min(dim=1, keepdim=True)
        pmask_blk = step_blk.eq(min_vals) & valid
        if not pmask_blk.any():
            return rows
        ge_mask_blk = step_blk.ge(min_vals) & valid
        pmask_tail, ge_mask_tail = pmask_blk.view(-1)[:l1], ge_mask_blk.view(-1)[:l1]
        tail = ids.clone()
        tail[ge_mask_tail] = MASK
        rows.append((tail, pmask_tail))
        step_b = step_b.clone()
        step_b[pmask_tail] = -1


# dLLM-RL: train/rl_llada.py:256-288 at 10b4fd1 (L0 = 0, post_num = None)
def _dllmrl_llada_rows(ids: torch.Tensor, step_map: list[int], shrink: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    order = torch.as_tensor(_dllmrl_collapse_k_unique(step_map, shrink))
    rows = []
    for step_val in torch.unique(order, sorted=True):
        noisy = ids.clone()
        noisy[order >= step_val] = MASK
        rows.append((noisy, order == step_val))
    return rows


def _random_steps(gen: torch.Generator, b: int, n: int, max_step: int) -> torch.Tensor:
    return torch.randint(0, max_step, (b, n), generator=gen)


@pytest.mark.parametrize("shrink", [1, 2, 3, 8])
def test_shrink_steps_equals_collapse_k_unique_per_block_and_whole(shrink: int) -> None:
    gen = torch.Generator().manual_seed(shrink)
    step = _random_steps(gen, 5, 22, 30)
    blk = torch.arange(22)[None].expand(5, -1) // 4
    ours_blk = shrink_steps(step, shrink, block_ids=blk)
    ours_all = shrink_steps(step, shrink)
    for b in range(5):
        assert ours_blk[b].tolist() == _dllmrl_shrink_blocks(step[b].tolist(), 4, shrink)
        assert ours_all[b].tolist() == _dllmrl_collapse_k_unique(step[b].tolist(), shrink)


def test_shrink_steps_leaves_positions_off_the_trajectory() -> None:
    step = torch.tensor([[-1, -1, 3, 5, 9, 11]])
    # distinct steps 3, 5, 9, 11 in pairs: (3, 5) -> 5, (9, 11) -> 11
    assert shrink_steps(step, 2).tolist() == [[-1, -1, 5, 5, 11, 11]]
    with pytest.raises(ValueError, match="shrink must be >= 1"):
        shrink_steps(step, 0)


def _plan_rows(ids: torch.Tensor, rounds: torch.Tensor) -> list[tuple[list[int], list[bool]]]:
    plan = replay_plan(rounds[None])
    out = []
    for k in range(plan.mask.shape[1]):
        scored = plan.meta["scored"][0, k]
        if scored.any():
            out.append((torch.where(plan.mask[0, k], MASK, ids).tolist(), scored.tolist()))
    return out


@pytest.mark.parametrize("shrink", [1, 2])
def test_sliced_block_rounds_equal_the_authors_rows(shrink: int) -> None:
    gen = torch.Generator().manual_seed(7 + shrink)
    for _ in range(4):
        n, bs = 18, 4
        ids = torch.randint(0, 50, (n,), generator=gen)
        step = torch.randint(0, 12, (n,), generator=gen)
        blk = (torch.arange(n) // bs)[None]
        merged = shrink_steps(step[None], shrink, block_ids=blk)
        ours = _plan_rows(ids, replay_rounds(merged, block_ids=blk)[0])
        theirs = _dllmrl_sdar_rounds(ids, torch.as_tensor(_dllmrl_shrink_blocks(step.tolist(), bs, shrink)), bs)
        assert ours == [(t.tolist(), p.tolist()) for t, p in theirs]


@pytest.mark.parametrize("shrink", [1, 3, 8])
def test_masked_model_rounds_equal_the_authors_rows(shrink: int) -> None:
    gen = torch.Generator().manual_seed(11 + shrink)
    ids = torch.randint(0, 50, (20,), generator=gen)
    step = torch.randint(0, 15, (20,), generator=gen)
    ours = _plan_rows(ids, replay_rounds(shrink_steps(step[None], shrink))[0])
    theirs = _dllmrl_llada_rows(ids, step.tolist(), shrink)
    assert ours == [(t.tolist(), p.tolist()) for t, p in theirs]


def test_block_ids_of_a_response_only_row_are_the_authors_grid() -> None:
    # with no prompt the global grid is the authors' response grid (blocks of L0 + j * block_size)
    assert block_ids(torch.ones(1, 10, dtype=torch.bool), 4).tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2]]


# dLLM-RL: train/rl_sdar.py:711-760 at 10b4fd1 (the model call replaced by its token log-probs)
def _dllmrl_sdar_loss(logp_new_tok, logp_old_tok, p_mask, adv, eps, beta, l1):  # type: ignore[no-untyped-def]
    B = p_mask.shape[0]
    ratio = logp_new_tok - logp_old_tok
    ratio = torch.where(p_mask, ratio, torch.zeros_like(ratio)).clamp(-10.0, 10.0)
    ratio = torch.exp(ratio)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    adv_tok = adv.unsqueeze(1) if adv.dim() == 1 else adv  # train_sdar_policy.py:498 passes adv [B, T]
    surrogate_tok = torch.min(ratio * adv_tok, clipped * adv_tok)
    surrogate_tok = surrogate_tok * p_mask
    surrogate_tok = surrogate_tok.sum(dim=1) / l1
    policy_loss = -(surrogate_tok.sum() / B)
    if beta > 0:
        kl_seq = logp_new_tok - logp_old_tok
        kl_seq = torch.where(p_mask, kl_seq, torch.zeros_like(kl_seq))
        t = (-kl_seq).clamp(-10.0, 10.0)
        kl_seq = t.exp() - 1.0 + kl_seq
        kl_seq = (kl_seq * p_mask).sum(dim=1) / l1
        return policy_loss + beta * kl_seq.sum() / B
    return policy_loss


# dLLM-RL: train/rl_llada.py:573-607 at 10b4fd1 (the model call replaced by its token log-probs)
def _dllmrl_llada_loss(logp_new_tok, logp_old_tok, p_mask_lm, adv, eps, beta):  # type: ignore[no-untyped-def]
    B = p_mask_lm.shape[0]
    ratio = torch.exp(logp_new_tok - logp_old_tok)
    clipped = torch.clamp(ratio, 1 - eps, 1 + eps)
    adv_tok = adv.unsqueeze(1)
    surrogate_tok = torch.min(ratio * adv_tok, clipped * adv_tok)
    surrogate_tok = surrogate_tok * p_mask_lm
    num_mask = torch.clamp(p_mask_lm.sum(dim=1), min=1)
    surrogate_tok = surrogate_tok.sum(dim=1) / num_mask
    policy_loss = -(surrogate_tok.sum() / B)
    if beta > 0:
        kl_seq = logp_new_tok - logp_old_tok
        kl_seq = (-kl_seq).exp() - 1.0 + kl_seq
        kl_seq = (kl_seq * p_mask_lm).sum(dim=1)
        return policy_loss + beta * kl_seq.sum() / B
    return policy_loss


def _inputs(seed: int, m: int = 6, n: int = 12, token_adv: bool = False):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(m, n, generator=gen, dtype=torch.float64) * 3
    new = (old + 0.4 * torch.randn(m, n, generator=gen, dtype=torch.float64)).requires_grad_(True)
    mask = torch.rand(m, n, generator=gen) < 0.5
    mask[0] = False  # an empty row
    shape = (m, n) if token_adv else (m,)
    adv = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return new, old, mask, adv


@pytest.mark.parametrize("beta", [0.0, 0.01, 0.5])
@pytest.mark.parametrize("token_adv", [False, True])
def test_block_loss_and_gradient_equal_the_authors(beta: float, token_adv: bool) -> None:
    new, old, mask, adv = _inputs(int(beta * 100) + token_adv, token_adv=token_adv)
    ours, _ = trace_policy_loss(new, old, adv, mask, clip=0.2, kl_coef=beta, normalization="length", length=15)
    (g_ours,) = torch.autograd.grad(ours, new)
    theirs = _dllmrl_sdar_loss(new, old, mask, adv, 0.2, beta, 15)
    (g_theirs,) = torch.autograd.grad(theirs, new)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-12)
    assert g_ours.abs().sum() > 0


@pytest.mark.parametrize("beta", [0.0, 0.01, 0.5])
def test_masked_loss_and_gradient_equal_the_authors(beta: float) -> None:
    new, old, mask, adv = _inputs(3 + int(beta * 100))
    ours, _ = trace_policy_loss(new, old, adv, mask, clip=0.2, kl_coef=beta, normalization="tokens")
    (g_ours,) = torch.autograd.grad(ours, new)
    theirs = _dllmrl_llada_loss(new, old, mask, adv, 0.2, beta)
    (g_theirs,) = torch.autograd.grad(theirs, new)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-12)


def test_num_rows_is_the_accumulated_mean_over_micro_batches() -> None:
    # the authors divide each micro-batch by its rows and the accumulation by its steps: with equal
    # micro-batches that is the mean over all rows, which num_rows gives a slice of them
    new, old, mask, adv = _inputs(5)
    whole, _ = trace_policy_loss(new, old, adv, mask, normalization="length")
    halves = sum(trace_policy_loss(new[s], old[s], adv[s], mask[s], normalization="length", num_rows=6)[0]
                 for s in (slice(0, 3), slice(3, 6)))
    torch.testing.assert_close(whole, halves, rtol=0, atol=1e-12)


def test_on_policy_ratio_is_one_and_zero_advantage_gives_zero_gradient() -> None:
    new, old, mask, adv = _inputs(9)
    same = old.clone().requires_grad_(True)
    loss, metrics = trace_policy_loss(same, old, torch.zeros_like(adv), mask, kl_coef=0.3)
    (g,) = torch.autograd.grad(loss, same)
    # on-policy: k3 = e^0 - 1 + 0 = 0 and its gradient 1 - e^0 = 0; zero advantage: zero surrogate
    assert float(loss.detach()) == 0.0 and float(g.abs().max()) == 0.0 and float(metrics["clip_frac"]) == 0.0


def test_hand_worked_block_loss() -> None:
    # one row, L = 4, two scored tokens, A = 1, eps = 0.2, no KL:
    # token 0: rho = e^0.1 = 1.105 (inside the clip) -> 1.105; token 1: rho = e^0.5 = 1.649 -> clipped 1.2
    # row: (1.105171 + 1.2) / 4 = 0.576293; loss = -0.576293
    new = torch.tensor([[0.1, 0.5, 9.0, 0.0]], dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False]])
    loss, _ = trace_policy_loss(new, old, torch.ones(1, dtype=torch.float64), mask, kl_coef=0.0)
    assert float(loss) == pytest.approx(-(torch.e ** 0.1 + 1.2) / 4, abs=1e-12)


def test_bad_arguments_name_the_field() -> None:
    new, old, mask, adv = _inputs(1)
    with pytest.raises(ValueError, match="normalization"):
        trace_policy_loss(new, old, adv, mask, normalization="mean")
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        trace_policy_loss(new, old, adv, mask, kl_coef=-1.0)


# dLLM-RL: reward/rl_reward.py:74-79 and :112-114 at 10b4fd1
def _dllmrl_z_score(lst: list[float]) -> list[float]:
    mean = sum(lst) / len(lst)
    std = (sum((x - mean) ** 2 for x in lst) / len(lst)) ** 0.5
    if std == 0:
        return [0 for x in lst]
    return [(x - mean) / std for x in lst]


def test_advantages_and_group_filter_equal_the_authors() -> None:
    groups = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 1.0],
              [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]]
    scores = torch.tensor([x for g in groups for x in g], dtype=torch.float64)
    gid = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    ours = grpo_advantages(scores, gid, eps=0.0, unbiased_std=False)
    theirs = torch.tensor([x for g in groups for x in _dllmrl_z_score(g)], dtype=torch.float64)
    torch.testing.assert_close(ours.double(), theirs, rtol=0, atol=1e-6)  # grpo_advantages computes in float32
    keep = trace_group_filter(scores, gid)
    kept = [not (sum(g) / len(g) > 0.8 or sum(g) / len(g) < 0.2) for g in groups]  # rl_reward.py:112-114
    assert keep.tolist() == [k for k, g in zip(kept, groups) for _ in g]


# dLLM-RL: train/train_sdar_value.py:771-846 at 10b4fd1 (one sequence; RLVR outcome reward)
def _dllmrl_returns(step_map_s, trainable_mask, per_seq_reward, V_resp, gamma, lam):  # type: ignore[no-untyped-def]
    L1 = step_map_s.shape[0]
    valid_steps = step_map_s[trainable_mask]
    last_step_id = int(valid_steps.max().item())
    r_resp = torch.zeros(L1, dtype=torch.float64)
    r_resp[(step_map_s == last_step_id) & trainable_mask] = per_seq_reward
    uniq_steps = torch.unique(step_map_s[trainable_mask], sorted=True)
    S = uniq_steps.numel()
    step_to_rank = {int(uniq_steps[i].item()): i for i in range(S)}
    r_star = torch.zeros(S, dtype=torch.float64)
    V_star = torch.zeros(S, dtype=torch.float64)
    for sid in uniq_steps.tolist():
        mask = (step_map_s == sid) & trainable_mask
        r_star[step_to_rank[sid]] = r_resp[mask].mean() if mask.any() else 0.0
        V_star[step_to_rank[sid]] = V_resp[mask].mean() if mask.any() else 0.0
    R_star = torch.zeros(S, dtype=torch.float64)
    for i in range(S - 1, -1, -1):
        R_star[i] = r_star[i] + (gamma * R_star[i + 1] if i + 1 < S else 0.0)
    delta_star = torch.zeros(S, dtype=torch.float64)
    for i in range(S):
        v_next = V_star[i + 1] if i + 1 < S else 0.0
        delta_star[i] = r_star[i] - V_star[i] + gamma * v_next
    A_star = torch.zeros(S, dtype=torch.float64)
    for i in range(S - 1, -1, -1):
        A_star[i] = delta_star[i] + (gamma * lam * A_star[i + 1] if i + 1 < S else 0.0)
    R_resp = torch.zeros(L1, dtype=torch.float64)
    A_resp = torch.zeros(L1, dtype=torch.float64)
    for pos in torch.nonzero(trainable_mask, as_tuple=False).flatten().tolist():
        i = step_to_rank[int(step_map_s[pos].item())]
        rj = r_resp[pos]
        R_next = R_star[i + 1] if i + 1 < S else 0.0
        V_next = V_star[i + 1] if i + 1 < S else 0.0
        A_next = A_star[i + 1] if i + 1 < S else 0.0
        R_resp[pos] = rj + gamma * R_next
        A_resp[pos] = (rj - V_resp[pos]) + gamma * V_next + gamma * lam * A_next
    return R_resp, A_resp


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (1.0, 0.0), (0.9, 0.95), (0.5, 0.3)])
def test_value_returns_and_advantages_equal_the_authors(gamma: float, lam: float) -> None:
    gen = torch.Generator().manual_seed(int(gamma * 10 + lam * 100))
    b, n = 5, 16
    step = shrink_steps(torch.randint(0, 20, (b, n), generator=gen), 2)
    mask = torch.rand(b, n, generator=gen) < 0.8
    mask[:, 0] = True
    rewards = torch.randn(b, generator=gen, dtype=torch.float64)
    values = torch.randn(b, n, generator=gen, dtype=torch.float64)
    tok_r = outcome_token_rewards(step, rewards, mask).double()
    ret, adv = trace_returns_and_advantages(step, tok_r, values, mask, gamma=gamma, lam=lam)
    for i in range(b):
        r_theirs, a_theirs = _dllmrl_returns(step[i], mask[i], float(rewards[i]), values[i], gamma, lam)
        torch.testing.assert_close(ret[i], r_theirs, rtol=0, atol=1e-12)
        torch.testing.assert_close(adv[i], a_theirs, rtol=0, atol=1e-12)
    if gamma == lam == 1.0:  # the authors' own check (train_sdar_value.py:862-872): R = reward, A = R - V
        torch.testing.assert_close(ret, torch.where(mask, rewards[:, None].expand(b, n), 0.0))
        torch.testing.assert_close(adv, torch.where(mask, ret - values, 0.0))


# dLLM-RL: train/train_sdar_value.py:994-1005 at 10b4fd1 (the model call replaced by its values)
def _dllmrl_value_loss(values, p_mask, Return, old_values, eps, L1):  # type: ignore[no-untyped-def]
    B = p_mask.shape[0]
    values = torch.where(p_mask, values, torch.zeros_like(values))
    v_clipped = old_values + (values - old_values).clamp(-eps, eps)
    loss_unclipped = (values - Return) ** 2
    loss_clipped = (v_clipped - Return) ** 2
    loss = 0.5 * torch.maximum(loss_unclipped, loss_clipped) * p_mask
    loss = loss.sum(dim=1) / L1
    return loss.sum() / B


def test_value_loss_and_gradient_equal_the_authors() -> None:
    gen = torch.Generator().manual_seed(2)
    m, n = 6, 10
    old = torch.randn(m, n, generator=gen, dtype=torch.float64)
    values = (old + 0.5 * torch.randn(m, n, generator=gen, dtype=torch.float64)).requires_grad_(True)
    ret = torch.randn(m, n, generator=gen, dtype=torch.float64)
    mask = torch.rand(m, n, generator=gen) < 0.5
    ours = trace_value_loss(values, old, ret, mask, clip=0.2, length=12)
    theirs = _dllmrl_value_loss(values, mask, ret, old, 0.2, 12)
    (g_ours,) = torch.autograd.grad(ours, values)
    (g_theirs,) = torch.autograd.grad(theirs, values)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(g_ours, g_theirs, rtol=0, atol=1e-12)
    assert g_ours.abs().sum() > 0
