"""Tests for dllm_objectives.likelihood: hand cases and ELBO exactness relations
(docs/algorithms.md#elbo, #invariants)."""

from __future__ import annotations

import math

import pytest
import torch

import dllm_objectives as do

L = 4


def test_token_logp_from_logits_hand_case_and_float32() -> None:
    # logits [0, ln 3] -> softmax [1/4, 3/4]; target 1 -> log 0.75
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.bfloat16)
    out = do.token_logp_from_logits(logits, torch.tensor([1]))
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(math.log(0.75), abs=1e-2)  # bf16 input rounding
    # temperature 0.5 doubles the logits: softmax [1/10, 9/10]
    out = do.token_logp_from_logits(torch.tensor([[0.0, math.log(3.0)]]), torch.tensor([1]), temperature=0.5)
    assert out.item() == pytest.approx(math.log(0.9), abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        do.token_logp_from_logits(logits, torch.tensor([1]), temperature=0.0)


def test_elbo_hand_case_and_normalizers() -> None:
    # masked positions 0 and 2 with p = 0.5: (-1 / 0.5) + (-2 / 0.5) = -6; position 1 ignored
    mask = torch.tensor([[[True, False, True, False]]])
    plan = do.MaskPlan(mask=mask, p_mask=torch.full((1, 1, 4), 0.5))
    lp = torch.tensor([[[-1.0, -100.0, -2.0, -3.0]]])
    assert do.elbo(lp, plan).item() == pytest.approx(-6.0)
    assert do.elbo(lp, plan, normalizer="padded").item() == pytest.approx(-1.5)  # / 4
    assert do.elbo(lp, plan, normalizer=torch.tensor([3.0])).item() == pytest.approx(-2.0)
    assert do.elbo(lp, plan, normalizer=2.0).item() == pytest.approx(-3.0)
    with pytest.raises(ValueError, match="normalizer"):
        do.elbo(lp, plan, normalizer="R")


def test_elbo_ignores_nonfinite_values_at_unmasked_positions() -> None:
    mask = torch.tensor([[[True, False]]])
    plan = do.MaskPlan(mask=mask, p_mask=torch.ones(1, 1, 2))
    lp = torch.tensor([[[-1.0, -math.inf]]])
    assert do.elbo(lp, plan).item() == -1.0


def _exact_expectation(toy, weight_of_mask) -> float:  # type: ignore[no-untyped-def]
    total = 0.0
    for m in toy.all_masks():
        w, pi = weight_of_mask(m)
        if w == 0.0:
            continue
        lp = toy.cond_logp(m)
        total += w * sum(float(lp[j]) / pi for j in range(L) if m[j])
    return total


def test_count_scheme_is_exact_by_enumeration(toy) -> None:  # type: ignore[no-untyped-def]
    # M3: k ~ U{1..L}, subset uniform among C(L, k): P(S) = 1 / (L C(L, k)), pi = k / L
    def w(m):  # type: ignore[no-untyped-def]
        k = sum(m)
        return (0.0, 1.0) if k == 0 else (1.0 / (L * math.comb(L, k)), k / L)

    assert _exact_expectation(toy, w) == pytest.approx(toy.log_p, abs=1e-12)


def test_iid_scheme_is_exact_by_enumeration(toy) -> None:  # type: ignore[no-untyped-def]
    # M7: E_t[sum_S t^{k}(1-t)^{L-k} sum_j l_j / t] = sum_S sum_j l_j int t^{k-1}(1-t)^{L-k} dt
    # and int_0^1 t^{k-1}(1-t)^{L-k} dt = 1 / (k C(L, k)).
    def w(m):  # type: ignore[no-untyped-def]
        k = sum(m)
        return (0.0, 1.0) if k == 0 else (1.0 / (k * math.comb(L, k)), 1.0)

    assert _exact_expectation(toy, w) == pytest.approx(toy.log_p, abs=1e-12)


def test_espo_antithetic_scheme_is_exact_by_enumeration(toy) -> None:  # type: ignore[no-untyped-def]
    # M4: x ~ U{0..L}, pi = x / (L + 1); complement pi^c = (L - x) / (L + 1); average of the two
    total = 0.0
    for m in toy.all_masks():
        x = sum(m)
        p_s = 1.0 / ((L + 1) * math.comb(L, x))
        comp = tuple(not b for b in m)
        lp, lpc = toy.cond_logp(m), toy.cond_logp(comp)
        a = sum(float(lp[j]) / (x / (L + 1)) for j in range(L) if m[j])
        c = sum(float(lpc[j]) / ((L - x) / (L + 1)) for j in range(L) if comp[j])
        total += p_s * 0.5 * (a + c)
    assert total == pytest.approx(toy.log_p, abs=1e-12)


def _within(samples: torch.Tensor, target: float, z: float = 5.0) -> None:
    """MC mean within z standard errors (sample std / sqrt(n)) of target."""
    s = samples.double()
    se = float(s.std() / math.sqrt(s.numel()))
    assert abs(float(s.mean()) - target) < z * se + 1e-9, (float(s.mean()), target, se)


def test_count_masks_mc_converges_to_log_likelihood(toy) -> None:  # type: ignore[no-untyped-def]
    valid = torch.ones(2000, L, dtype=torch.bool)
    plan = do.count_masks(valid, 4, generator=torch.Generator().manual_seed(1))
    est = do.elbo(toy.token_logp(plan.mask), plan)  # [2000, 4], stratified per row
    _within(est.mean(-1), toy.log_p)


def test_espo_masks_mc_converges_to_log_likelihood(toy) -> None:  # type: ignore[no-untyped-def]
    valid = torch.ones(2000, L, dtype=torch.bool)
    plan, comp = do.espo_masks(valid, 2, generator=torch.Generator().manual_seed(2))
    est = do.antithetic_elbo(toy.token_logp(plan.mask), toy.token_logp(comp.mask), plan, comp)
    _within(est.mean(-1), toy.log_p)


def test_coupled_masks_mc_converges_with_full_t_range(toy) -> None:  # type: ignore[no-untyped-def]
    # With t ~ U(0, 1) the two halves are M7 draws at t and 1 - t, so half their sum is unbiased.
    # (The default t in [0.2, 0.8] is biased for a general denoiser; exact for independent tokens.)
    valid = torch.ones(4000, L, dtype=torch.bool)
    plan = do.coupled_masks(valid, t_min=0.0, t_max=1.0, generator=torch.Generator().manual_seed(3))
    est = 0.5 * do.elbo(toy.token_logp(plan.mask), plan).sum(-1)
    # 1/t weights have heavy tails: compare with a looser z and the exact value
    _within(est, toy.log_p, z=6.0)


def test_iid_masks_mc_converges_to_its_exact_expectation(toy) -> None:  # type: ignore[no-untyped-def]
    # t ~ U(0, 1) gives infinite variance (1/t); with t ~ U[eps, 1], eps = 0.05, the exact expectation is
    # sum_S sum_j l_j int_eps^1 t^{k-1}(1-t)^{L-k} dt / (1 - eps) (numerical integral), which is
    # within 0.1 nats of log p here; the MC mean must match it within 5 standard errors.
    eps = 0.05
    grid = torch.linspace(eps, 1.0, 20001, dtype=torch.float64)

    def w(m):  # type: ignore[no-untyped-def]
        k = sum(m)
        if k == 0:
            return 0.0, 1.0
        dens = grid ** (k - 1) * (1 - grid) ** (L - k)
        return float(torch.trapezoid(dens, grid)) / (1 - eps), 1.0

    target = _exact_expectation(toy, w)
    assert abs(target - toy.log_p) < 0.1
    valid = torch.ones(8000, L, dtype=torch.bool)
    plan = do.iid_masks(valid, 1, t_min=eps, generator=torch.Generator().manual_seed(4))
    est = do.elbo(toy.token_logp(plan.mask), plan)[:, 0]
    _within(est, target)


def test_independent_token_denoiser_identity_every_fixed_count() -> None:
    # q_j(o_j) fixed per position: E[sum_{S} l_j L / k] = sum_j l_j for every k (each j in S w.p. k/L)
    lq = torch.tensor([-0.5, -1.0, -2.0, -0.25])
    valid = torch.ones(6000, L, dtype=torch.bool)
    for k in range(1, L + 1):
        counts = torch.full((6000, 1), k)
        mask = do.random_subset(valid, counts, generator=torch.Generator().manual_seed(k))
        plan = do.MaskPlan(mask=mask, p_mask=torch.full(mask.shape, k / L))
        est = do.elbo(lq.expand(mask.shape), plan)[:, 0]
        _within(est, float(lq.sum()))
    # k = L is deterministic: sum_j l_j * L / L exactly
    assert est.std() == 0 and est[0].item() == pytest.approx(float(lq.sum()))


def test_coupled_token_logp_hand_case() -> None:
    # t = 0.25; position 0 in half a, position 1 in half b:
    # pos0: 0.5 * (-1 + (-2) / 0.25) = -4.5; pos1: 0.5 * (-1 + (-3) / 0.75) = -2.5
    mask = torch.tensor([[[True, False], [False, True]]])
    p = torch.tensor([[[0.25, 0.25], [0.75, 0.75]]])
    plan = do.MaskPlan(mask=mask, p_mask=p, meta={"t": torch.tensor([[0.25, 0.75]])})
    out = do.coupled_token_logp(torch.tensor([[-1.0, -1.0]]), torch.tensor([[[-2.0, 0.0], [0.0, -3.0]]]), plan)
    assert out.tolist() == [[pytest.approx(-4.5), pytest.approx(-2.5)]]


def test_composite_block_elbo_weights() -> None:
    # two rows with ELBOs -2 and -4: uniform -> -3; weights (0.25, 0.75) -> -3.5
    plan = do.MaskPlan(mask=torch.ones(1, 2, 1, dtype=torch.bool), p_mask=torch.ones(1, 2, 1))
    lp = torch.tensor([[[-2.0], [-4.0]]])
    assert do.composite_block_elbo(lp, plan).item() == pytest.approx(-3.0)
    w = torch.tensor([0.25, 0.75])
    assert do.composite_block_elbo(lp, plan, sample_weights=w).item() == pytest.approx(-3.5)
