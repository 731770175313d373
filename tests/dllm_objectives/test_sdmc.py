"""GDPO's semi-deterministic Monte Carlo ELBO: quadrature rules, masks, the estimator, the loss.

The rules are checked against GDPO's own table (KevinRojas1499/GDPO@1918683,
gdpo/likelihood_estimators.py), the estimator against the exact ELBO of a toy joint by enumeration
(tests/dllm_objectives/conftest.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch

from dllm_objectives import gdpo_loss, quadrature_elbo, quadrature_rule, sdmc_masks
from tests.dllm_objectives.conftest import L, ToyJoint



def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    # torch.allclose: torch.testing.assert_close's first call costs seconds of imports
    assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-5, atol=1e-7), (a, b)


# GDPO: KevinRojas1499/GDPO@1918683 gdpo/likelihood_estimators.py:174-217 (points and weights on [-1, 1])
_GDPO_TABLE = {
    "gauss-1": ([0.0], [2.0]),
    "gauss-2": ([-(1 / 3**0.5), (1 / 3**0.5)], [1.0, 1.0]),
    "gauss-3": ([-(3 / 5)**0.5, 0.0, (3 / 5)**0.5], [5 / 9, 8 / 9, 5 / 9]),
    "gauss-4": ([-((3 / 7 - 2 / 7 * (6 / 5)**0.5)**0.5), +((3 / 7 - 2 / 7 * (6 / 5)**0.5)**0.5),
                 -((3 / 7 + 2 / 7 * (6 / 5)**0.5)**0.5), +((3 / 7 + 2 / 7 * (6 / 5)**0.5)**0.5)],
                [(18 + 30**0.5) / 36, (18 + 30**0.5) / 36, (18 - 30**0.5) / 36, (18 - 30**0.5) / 36]),
    "gauss-5": ([0.0, -(1 / 3) * (5 - 2 * (10 / 7)**0.5)**0.5, +(1 / 3) * (5 - 2 * (10 / 7)**0.5)**0.5,
                 -(1 / 3) * (5 + 2 * (10 / 7)**0.5)**0.5, +(1 / 3) * (5 + 2 * (10 / 7)**0.5)**0.5],
                [128 / 225, (322 + 13 * (70**0.5)) / 900, (322 + 13 * (70**0.5)) / 900,
                 (322 - 13 * (70**0.5)) / 900, (322 - 13 * (70**0.5)) / 900]),
}


@pytest.mark.parametrize("rule", sorted(_GDPO_TABLE))
def test_gauss_rules_equal_gdpos_table_bit_for_bit(rule: str) -> None:
    points, weights = _GDPO_TABLE[rule]
    # GDPO: likelihood_estimators.py:281 `xi = point * .5 + .5`, :286 `.5 * loss` (each weight halved)
    want = sorted((p * .5 + .5, .5 * w) for p, w in zip(points, weights))
    t, w = quadrature_rule(rule)
    assert t.tolist() == [x for x, _ in want]  # the nodes bit for bit: the mask counts floor(t L) agree
    assert w.tolist() == pytest.approx([y for _, y in want], rel=1e-15, abs=0)


def test_simpson_is_gdpos_and_gauss_n_integrates_polynomials_of_degree_2n_minus_1() -> None:
    # GDPO: likelihood_estimators.py:268-277: t = 0.1, 0.5, 1.0 and (l1 + 4 l2 + l3) / 6
    t, w = quadrature_rule("simpson")
    assert t.tolist() == [0.1, 0.5, 1.0] and w.tolist() == pytest.approx([1 / 6, 4 / 6, 1 / 6])
    for n in (1, 3, 5, 8, 13):  # 8 and 13 come from the Jacobi-matrix eigenvalues
        t, w = quadrature_rule(f"gauss-{n}")
        assert float(w.sum()) == pytest.approx(1.0, abs=1e-13) and bool((t > 0).all() and (t < 1).all())
        for d in range(2 * n):  # int_0^1 t^d dt = 1 / (d + 1)
            assert float((w * t**d).sum()) == pytest.approx(1 / (d + 1), abs=1e-13), (n, d)
        if n <= 5:  # and no further (the error of degree 2N shrinks below rounding for large N)
            assert float((w * t ** (2 * n)).sum()) != pytest.approx(1 / (2 * n + 1), abs=1e-9)


@pytest.mark.parametrize("rule", ["gauss-0", "gauss-65", "gauss", "trapezoid", "gauss-2.5"])
def test_bad_rule_names_the_valid_ones(rule: str) -> None:
    with pytest.raises(ValueError, match="valid: 'gauss-N' with 1 <= N <= 64"):
        quadrature_rule(rule)


def test_sdmc_masks_count_floor_t_l_valid_positions_with_p_mask_t() -> None:
    valid = torch.zeros(3, 12, dtype=torch.bool)
    valid[0, 2:12] = True  # L = 10
    valid[1, 2:6] = True  # L = 4
    valid[2, 2:9] = True  # L = 7
    plan = sdmc_masks(valid, rule="gauss-3", mc_samples=2, generator=torch.Generator().manual_seed(0))
    t = (0.5 - 0.5 * 0.6**0.5, 0.5, 0.5 + 0.5 * 0.6**0.5)  # 0.1127, 0.5, 0.8873
    # floor(t L): L=10 -> 1, 5, 8; L=4 -> 0 (0.45), 2, 3 (3.55); L=7 -> 0 (0.79), 3 (3.5), 6 (6.21)
    want = torch.tensor([[1, 1, 5, 5, 8, 8], [0, 0, 2, 2, 3, 3], [0, 0, 3, 3, 6, 6]])
    assert torch.equal(plan.mask.sum(-1), want) and torch.equal(plan.meta["counts"], want)
    assert not bool((plan.mask & ~valid[:, None, :]).any())
    ts = torch.tensor(t).repeat_interleave(2).float()
    _close(plan.meta["t"], ts.expand(3, -1))
    _close(plan.p_mask, ts[None, :, None] * valid[:, None, :].float())
    _close(plan.meta["weight"].sum(-1), torch.ones(3))  # w / mc_samples, summing to 1
    _close(plan.meta["weight"][0], torch.tensor([5, 5, 8, 8, 5, 5]) / 36.0)
    assert not torch.equal(plan.mask[0, 2], plan.mask[0, 3])  # two independent draws at t = 0.5


def test_sdmc_masks_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mc_samples must be >= 1"):
        sdmc_masks(torch.ones(1, 4, dtype=torch.bool), mc_samples=0, generator=torch.Generator())
    with pytest.raises(ValueError, match="valid must be a bool tensor"):
        sdmc_masks(torch.ones(1, 4), generator=torch.Generator())


def test_quadrature_elbo_by_hand() -> None:
    # one row, L = 4, gauss-2 (t = 0.2113, 0.7887; w = 1/2, 1/2): counts floor(0.845) = 0, floor(3.15) = 3
    valid = torch.ones(1, 4, dtype=torch.bool)
    plan = sdmc_masks(valid, rule="gauss-2", generator=torch.Generator().manual_seed(1))
    lp = torch.tensor([-1.0, -2.0, -3.0, -4.0]).expand(1, 2, 4)
    hidden = plan.mask[0, 1]
    # E = 1/2 * 0 / t1 + 1/2 * (sum of the 3 masked log-probs) / t2
    t2 = 0.5 + 0.5 / 3**0.5
    want = 0.5 * float(lp[0, 1][hidden].sum()) / t2
    assert int(hidden.sum()) == 3
    assert float(quadrature_elbo(lp, plan)[0]) == pytest.approx(want, rel=1e-6)
    # normalised by the padded width, as dllm_objectives.elbo
    assert float(quadrature_elbo(lp, plan, normalizer="padded")[0]) == pytest.approx(want / 4, rel=1e-6)
    with pytest.raises(ValueError, match="no 'weight'"):
        from dllm_objectives import count_masks
        quadrature_elbo(lp, count_masks(valid, 2, generator=torch.Generator()))


def _subset_means(toy: ToyJoint) -> dict[int, float]:
    """k -> mean over all k-subsets S of sum_{j in S} log p(o_j | o outside S) (exact conditionals)."""
    out: dict[int, float] = {}
    for k in range(L + 1):
        subsets = [m for m in itertools.product([False, True], repeat=L) if sum(m) == k]
        out[k] = sum(float(toy.cond_logp(m)[list(m)].sum()) for m in subsets) / len(subsets)
    return out


def test_gauss_quadrature_of_the_elbo_integral_is_exact_for_short_sequences(toy: ToyJoint) -> None:
    """With Bernoulli(t) masks the integrand (1/t) E[...] = sum_k C(L,k) t^(k-1) (1-t)^(L-k) H(k) is a
    polynomial of degree L - 1 = 3, so 2-point Gauss gives the ELBO integral exactly; the ELBO itself is
    sum_k H(k) / k (exact enumeration), equal to log p(o) for exact conditionals."""
    h = _subset_means(toy)
    exact_elbo = sum(h[k] / k for k in range(1, L + 1))

    def integrand(t: float) -> float:
        return sum(math.comb(L, k) * t ** (k - 1) * (1 - t) ** (L - k) * h[k] for k in range(1, L + 1))

    for rule in ("gauss-2", "gauss-3", "gauss-5"):
        t, w = quadrature_rule(rule)
        assert sum(wk * integrand(tk) for tk, wk in zip(t.tolist(), w.tolist())) == pytest.approx(exact_elbo,
                                                                                                  rel=1e-12)
    t, w = quadrature_rule("gauss-1")  # degree 1 only: not exact
    assert float(w[0]) * integrand(float(t[0])) != pytest.approx(exact_elbo, rel=1e-3)
    assert exact_elbo == pytest.approx(toy.log_p, rel=1e-12)  # exact conditionals: the bound is tight


def test_sdmc_estimator_is_unbiased_over_the_mask_draws_at_each_node(
        toy: ToyJoint, gen: Callable[[int], torch.Generator]) -> None:
    """Mean of the estimator over many draws -> sum_k w_k H(floor(t_k L)) / t_k, enumerated."""
    h = _subset_means(toy)
    t, w = quadrature_rule("gauss-3")
    counts = [math.floor(tk * L) for tk in t.tolist()]  # 0, 2, 3
    expected = sum(wk * h[c] / tk for tk, wk, c in zip(t.tolist(), w.tolist(), counts))
    plan = sdmc_masks(torch.ones(4000, L, dtype=torch.bool), rule="gauss-3", generator=gen(3))
    est = quadrature_elbo(toy.token_logp(plan.mask), plan).double()
    stderr = float(est.std()) / math.sqrt(est.numel())
    assert stderr > 0 and abs(float(est.mean()) - expected) < 4 * stderr
    assert abs(float(est.mean()) - (expected + 0.5)) > 4 * stderr  # the check can fail


def test_gdpo_loss_by_hand() -> None:
    # length 4: r = exp((E - E_old) / 4); clip 0.5
    elbo = torch.tensor([-8.0, -8.0, -8.0], requires_grad=True)
    old = torch.tensor([-12.0, -8.0, -4.0])  # r = e (clipped at 1.5 for A > 0), 1, 1/e (clipped at 0.5)
    adv = torch.tensor([1.0, 2.0, -1.0])
    loss, metrics = gdpo_loss(elbo, old, adv, length=4.0, clip_low=0.5, clip_high=0.5)
    # -min(e * 1, 1.5 * 1) = -1.5; -min(2, 2) = -2; -min(-e^-1, -0.5) = 0.5  -> mean -1
    assert float(loss.detach()) == pytest.approx(-1.0)
    (g,) = torch.autograd.grad(loss, elbo)
    # only sequence 1 is unclipped: d/dE (-A r / 3) = -A r / (4 * 3) = -2 / 12
    _close(g, torch.tensor([0.0, -2 / 12, 0.0]))
    assert float(metrics["clip_frac"]) == pytest.approx(2 / 3)


def test_gdpo_loss_kl_is_k3_on_raw_elbos_and_on_policy_ratio_is_one() -> None:
    elbo = torch.tensor([-10.0, -20.0], requires_grad=True)
    ref = torch.tensor([-11.0, -19.5])
    adv = torch.zeros(2)
    loss, metrics = gdpo_loss(elbo, elbo.detach(), adv, length=8.0, ref_elbo=ref, kl_coef=0.1)
    d = ref - elbo.detach()  # GDPO: exp(ref - logp) - (ref - logp) - 1
    kl = (torch.exp(d) - d - 1).mean()
    assert float(loss.detach()) == pytest.approx(0.1 * float(kl), rel=1e-6)
    assert float(metrics["kl"]) == pytest.approx(float(kl), rel=1e-6)
    assert float(metrics["ratio_mean"]) == 1.0
    (g,) = torch.autograd.grad(loss, elbo)
    _close(g, 0.1 * (1 - torch.exp(d)) / 2)
    # zero advantages and no KL: zero gradient
    loss0, _ = gdpo_loss(elbo, elbo.detach() - 1.0, adv, length=8.0)
    (g0,) = torch.autograd.grad(loss0, elbo)
    assert torch.equal(g0, torch.zeros(2))


def test_gdpo_loss_bad_arguments() -> None:
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="length must be > 0"):
        gdpo_loss(x, x, x, length=0.0)
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        gdpo_loss(x, x, x, length=1.0, kl_coef=-1.0)
