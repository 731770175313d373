"""`dllm_algorithms.TraceRL` (prepare -> values -> loss) equals its authors' pipeline in float64.

The authors' pipeline (Gen-Verse/dLLM-RL at 10b4fd1) is transcribed below: z-scored rewards and the
group filter (reward/rl_reward.py), the training rows built from the step map (train/rl_sdar.py
``one_round_vectorized`` for block models, train/rl_llada.py's TraceRL branch for masked models),
and the loss of one optimizer step over those rows (``forward_process``). Both score their rows
with the same stand-in model, a float64 function of the noisy canvas and the visible context whose
parameters are the "weights" (old: the rollout policy, new: perturbed), so loss and gradient are
compared exactly; the authors' ``batch_size_lm * accumulation`` rows of one optimizer step are
one batch here (their loss is then the mean over rows, as ours).
"""

from __future__ import annotations

import pytest
import torch

from dllm_algorithms import TraceRL
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import LossInputs, RLBatch, SpecialTokens

V, MASK, EOS, PAD = 11, 10, 9, 8
P, BLOCK = 4, 4  # a whole-block prompt: DARE's global block grid is then the authors' response grid


class StandIn:
    """A differentiable stand-in scorer: logits_i = E[x_i] + mean_{j visible} C[x_j] + Q[i]."""

    mask_id, eos_id, pad_id, lockstep_group = MASK, EOS, PAD, None

    def __init__(self, params: dict[str, torch.Tensor], block_length: int | None) -> None:
        self.p = params
        self.block_length = block_length

    def logp(self, noisy: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        vis = attention.to(torch.float64)
        ctx = (self.p["C"][noisy] * vis[..., None]).sum(1, keepdim=True) / vis.sum(1, keepdim=True)[..., None]
        logits = self.p["E"][noisy] + ctx + self.p["Q"][: noisy.shape[1]]
        return torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        return self.logp(noisy_ids, attention_mask, targets)


def _params(seed: int, length: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, generator=g, dtype=torch.float64)
            for k, s in {"E": (V, V), "C": (V, V), "Q": (length, V)}.items()}


# dLLM-RL: train/rl_sdar.py:219-231 at 10b4fd1
def _collapse_k_unique(lst: list[int], k: int) -> list[int]:
    uniq = sorted(set(lst))
    mapping = {}
    for idx, val in enumerate(uniq):
        mapping[val] = uniq[min((idx // k + 1) * k - 1, len(uniq) - 1)]
    return [mapping[x] for x in lst]


# dLLM-RL: reward/rl_reward.py:74-79, :105 at 10b4fd1 -> (sample, its z-scored reward) pairs
def _dllmrl_z_scores(correct: list[list[float]]) -> list[tuple[int, float]]:
    out, base = [], 0
    for group in correct:
        mean = sum(group) / len(group)
        std = (sum((x - mean) ** 2 for x in group) / len(group)) ** 0.5
        z = [0.0 for _ in group] if std == 0 else [(x - mean) / std for x in group]
        out += [(base + j, z[j]) for j in range(len(group))]
        base += len(group)
    return out


# dLLM-RL: reward/rl_reward.py:112-121 at 10b4fd1 -> the samples of the kept groups, with their rewards
def _dllmrl_rewards(correct: list[list[float]]) -> list[tuple[int, float]]:
    z, out = dict(_dllmrl_z_scores(correct)), []
    for gi, group in enumerate(correct):
        p = sum(group) / len(group)
        if not (p > 0.8 or p < 0.2):
            out += [(gi * len(group) + j, z[gi * len(group) + j]) for j in range(len(group))]
    return out


# dLLM-RL: train/rl_sdar.py:516-547 (with :366-424) at 10b4fd1 -> (noisy response, p_mask) rows of one sample
def _dllmrl_sdar_rows(resp: torch.Tensor, step_map: list[int], shrink: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    l1 = resp.shape[0]
    for j in range(int((l1 - 1) / BLOCK) + 1):
        s, e = j * BLOCK, min(l1, (j + 1) * BLOCK)
        step_map[s:e] = _collapse_k_unique(step_map[s:e], shrink)
    step_b, rows = torch.as_tensor(step_map), []
    nb = (l1 + BLOCK - 1) // BLOCK
    while True:
        step_pad = torch.full((nb * BLOCK,), -1, dtype=torch.long)
        step_pad[:l1] = step_b
        step_blk = step_pad.view(nb, BLOCK)
        valid = step_blk.ge(0)
        min_vals, _ = step_blk.masked_fill(~valid, torch.iinfo(torch.long).max).min(dim=1, keepdim=True)
        pmask_blk = step_blk.eq(min_vals) & valid
        if not pmask_blk.any():
            return rows
        pmask_tail, ge_tail = pmask_blk.view(-1)[:l1], (step_blk.ge(min_vals) & valid).view(-1)[:l1]
        tail = resp.clone()
        tail[ge_tail] = MASK
        rows.append((tail, pmask_tail))
        step_b = step_b.clone()
        step_b[pmask_tail] = -1


# dLLM-RL: train/rl_llada.py:254-288 at 10b4fd1 (post_num = 0) -> (noisy response, p_mask) rows of one sample
def _dllmrl_llada_rows(resp: torch.Tensor, step_map: list[int], shrink: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    order = torch.as_tensor(_collapse_k_unique(step_map, shrink))
    pad = resp == PAD
    tail_pad = pad & ~(pad & (torch.cumsum(pad.int(), dim=0) <= 0))
    rows = []
    for step_val in torch.unique(order, sorted=True):
        pmask = (order == step_val) & ~tail_pad
        if not pmask.any():
            continue
        noisy = resp.clone()
        noisy[order >= step_val] = MASK
        rows.append((noisy, pmask))
    return rows


# dLLM-RL: train/rl_sdar.py:731-756 (block) and train/rl_llada.py:584-603 (masked) at 10b4fd1
def _dllmrl_loss(new, old, p_mask, adv, *, block: bool, eps: float, beta: float, l1: int):  # type: ignore[no-untyped-def]
    B = p_mask.shape[0]
    adv_tok = adv.unsqueeze(1)
    if block:
        ratio = torch.where(p_mask, new - old, torch.zeros_like(new)).clamp(-10.0, 10.0).exp()
    else:
        ratio = torch.exp(new - old)
    surrogate_tok = torch.min(ratio * adv_tok, torch.clamp(ratio, 1 - eps, 1 + eps) * adv_tok) * p_mask
    if block:
        surrogate_tok = surrogate_tok.sum(dim=1) / l1
    else:
        surrogate_tok = surrogate_tok.sum(dim=1) / torch.clamp(p_mask.sum(dim=1), min=1)
    policy_loss = -(surrogate_tok.sum() / B)
    kl_seq = new - old
    if block:
        kl_seq = torch.where(p_mask, kl_seq, torch.zeros_like(kl_seq))
        kl_seq = (-kl_seq).clamp(-10.0, 10.0).exp() - 1.0 + kl_seq
        kl_seq = (kl_seq * p_mask).sum(dim=1) / l1
    else:
        kl_seq = ((-kl_seq).exp() - 1.0 + kl_seq)
        kl_seq = (kl_seq * p_mask).sum(dim=1)
    return policy_loss + beta * kl_seq.sum() / B


def _rollout(block: bool, seed: int) -> tuple[RolloutBatch, list[list[float]]]:
    """4 groups of 4: block rows end on the block grid (whole blocks, as the authors' rows are
    whole response blocks); masked rows end with EOS then PAD (the authors' padding)."""
    g = torch.Generator().manual_seed(seed)
    b, r = 16, 8
    prompt = torch.randint(0, 8, (b, P), generator=g)
    resp = torch.randint(0, 8, (b, r), generator=g)
    if block:
        pmask = torch.ones(b, P, dtype=torch.bool)
        step = torch.randint(0, 6, (b, r), generator=g)
        rmask = torch.ones(b, r, dtype=torch.bool)
    else:
        n = torch.randint(3, r + 1, (b,), generator=g)
        ar = torch.arange(r)[None]
        resp = torch.where(ar == n[:, None] - 1, EOS, torch.where(ar >= n[:, None], PAD, resp))
        pmask = torch.ones(b, P, dtype=torch.bool)
        step = torch.randint(0, 10, (b, r), generator=g)
        rmask = ar < n[:, None]
    cfg = SamplingConfig(max_new_tokens=r, steps=r, block_length=BLOCK, record_trajectory=True,
                         block_diffusion=block)
    rollout = RolloutBatch(prompt_ids=prompt, prompt_mask=pmask, response_ids=resp, response_mask=rmask,
                           seeds=torch.arange(b), unmask_step=step, config=cfg)
    correct = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]]
    return rollout, correct


def _theirs(rollout: RolloutBatch, correct: list[list[float]], new: StandIn, old: StandIn, *, block: bool,
            shrink: int, eps: float, beta: float) -> torch.Tensor:
    rows, advs = [], []
    for i, adv in _dllmrl_rewards(correct):
        step_map = rollout.unmask_step[i].tolist()  # type: ignore[index]
        resp = rollout.response_ids[i]
        build = _dllmrl_sdar_rows if block else _dllmrl_llada_rows
        for noisy, pm in build(resp, step_map, shrink):
            rows.append((torch.cat([rollout.prompt_ids[i], noisy]), torch.cat([rollout.prompt_ids[i], resp]),
                         torch.cat([torch.zeros(P, dtype=torch.bool), pm])))
            advs.append(adv)
    noisy = torch.stack([x[0] for x in rows])
    clean = torch.stack([x[1] for x in rows])
    p_mask = torch.stack([x[2] for x in rows])
    attn = torch.ones_like(noisy, dtype=torch.bool)
    with torch.no_grad():
        lp_old = old.logp(noisy, attn, clean)
    lp_new = new.logp(noisy, attn, clean)
    return _dllmrl_loss(lp_new, lp_old, p_mask, torch.tensor(advs, dtype=torch.float64), block=block, eps=eps,
                        beta=beta, l1=rollout.response_ids.shape[1])


def _ours(rollout: RolloutBatch, correct: list[list[float]], new: StandIn, old: StandIn,
          alg: TraceRL) -> torch.Tensor:
    scores = torch.tensor([x for g in correct for x in g], dtype=torch.float64)
    gid = torch.arange(len(correct)).repeat_interleave(4)
    batch = RLBatch(rollout=rollout, scores=scores, group_ids=gid, tokens=SpecialTokens(MASK, EOS, PAD))
    data = alg.prepare(batch, torch.Generator().manual_seed(0))
    with torch.no_grad():
        v_old = alg.values(old, batch, data, 0)
    v_new = alg.values(new, batch, data, 0)
    # the advantages in float64: grpo_advantages computes in float32 (equal to 1e-6, checked here)
    adv = torch.zeros(len(scores), dtype=torch.float64)
    for i, z in _dllmrl_z_scores(correct):
        adv[i] = z
    torch.testing.assert_close(alg.advantages(scores, gid).double(), adv, rtol=0, atol=1e-6)
    loss, _ = alg.loss(v_new, LossInputs(batch=batch, data=data, iteration=0, advantages=adv, old=v_old, ref=None))
    return loss


@pytest.mark.parametrize("block", [True, False], ids=["block", "masked"])
@pytest.mark.parametrize("shrink", [1, 2, 3])
@pytest.mark.parametrize("beta", [0.0, 0.01, 0.3])
def test_tracerl_loss_and_gradient_equal_the_authors(block: bool, shrink: int, beta: float) -> None:
    rollout, correct = _rollout(block, seed=shrink)
    weights = _params(1, P + rollout.response_ids.shape[1])
    moved = {k: (v + 0.3 * torch.randn_like(v)).requires_grad_(True) for k, v in weights.items()}
    old, new = StandIn(weights, BLOCK if block else None), StandIn(moved, BLOCK if block else None)
    alg = TraceRL(shrink=shrink, clip=0.2, kl_coef=beta)
    ours = _ours(rollout, correct, new, old, alg)
    g_ours = torch.autograd.grad(ours, list(moved.values()))
    theirs = _theirs(rollout, correct, new, old, block=block, shrink=shrink, eps=0.2, beta=beta)
    g_theirs = torch.autograd.grad(theirs, list(moved.values()))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert sum(float(g.abs().sum()) for g in g_ours) > 0


def test_tracerl_refuses_a_rollout_without_its_trace() -> None:
    rollout, correct = _rollout(False, seed=0)
    rollout.unmask_step = None
    batch = RLBatch(rollout=rollout, scores=torch.zeros(16), group_ids=torch.arange(16) // 4,
                    tokens=SpecialTokens(MASK, EOS, PAD))
    with pytest.raises(ValueError, match="record_trajectory=True"):
        TraceRL().prepare(batch, torch.Generator())


def test_tracerl_records_the_trace_and_validates_its_fields() -> None:
    cfg = SamplingConfig(max_new_tokens=8, steps=8, block_length=4)
    assert TraceRL().sampling(cfg).record_trajectory and TraceRL.record_fields == frozenset({"unmask_step"})
    with pytest.raises(ValueError, match="algorithm.shrink must be >= 1"):
        TraceRL(shrink=0)
    with pytest.raises(ValueError, match="algorithm.min_group_accuracy"):
        TraceRL(min_group_accuracy=0.9, max_group_accuracy=0.1)
