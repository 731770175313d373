"""Argument checks of dllm_objectives: empty inputs and non-finite coefficients raise ValueError
naming the argument (issue #25 item 7), instead of an internal reshape error or a NaN result."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import dllm_objectives as do

NAN, INF = math.nan, math.inf
Z3 = torch.zeros(3)
G3 = torch.tensor([0, 0, 1])
EMPTY, EMPTY_IDS = torch.zeros(0), torch.zeros(0, dtype=torch.long)


def _dpo(**kw: Any) -> torch.Tensor:
    return do.dpo_loss(Z3, Z3, Z3, Z3, **kw)


def _clipped(**kw: Any) -> Any:
    lp = torch.zeros(2, 3)
    return do.clipped_policy_loss(lp, lp, torch.ones(2), torch.ones(2, 3, dtype=torch.bool), **kw)


EMPTY_CASES: list[tuple[str, Callable[[], Any]]] = [
    ("scores", lambda: do.grpo_advantages(EMPTY, EMPTY_IDS)),
    ("scores", lambda: do.grpo_advantages(torch.zeros(0, 4), EMPTY_IDS)),
    ("scores", lambda: do.rloo_advantages(EMPTY, EMPTY_IDS)),
    ("values", lambda: do.group_mean(EMPTY, EMPTY_IDS)),
    ("policy_chosen", lambda: do.dpo_loss(EMPTY, EMPTY, EMPTY, EMPTY, beta=0.1)),
    ("rewards", lambda: do.dmpo_weights(EMPTY, EMPTY, EMPTY_IDS, alpha=0.04)),
]


@pytest.mark.parametrize(("name", "call"), EMPTY_CASES)
def test_empty_inputs_raise_naming_the_argument(name: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ValueError, match=rf"^{name} is empty \(shape"):
        call()


NONFINITE_CASES: list[tuple[str, Callable[[float], Any]]] = [
    ("beta", lambda v: _dpo(beta=v)),
    ("length_normalizer", lambda v: _dpo(beta=0.1, length_normalizer=v)),
    ("eps", lambda v: do.grpo_advantages(Z3, G3, eps=v)),
    ("clip_high", lambda v: _clipped(clip_high=v)),
    ("dual_clip", lambda v: _clipped(dual_clip=v)),
    ("norm_const", lambda v: _clipped(agg="seq-mean-token-sum-norm", norm_const=v)),
    ("temperature", lambda v: do.token_logp_from_logits(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long),
                                                        temperature=v)),
    ("clamp", lambda v: do.kl_penalty(Z3, Z3, "k3", clamp=v)),
    ("alpha", lambda v: do.dmpo_weights(Z3, Z3, G3, alpha=v)),
    ("coeff", lambda v: do.dmpo_weights(Z3, Z3, G3, alpha=0.04, coeff=v)),
    ("strength", lambda v: do.dmpo_baseline(Z3, G3, kind="group", strength=v)),
    ("kl_coef", lambda v: do.tree_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2),
                                              torch.ones(2, 3, dtype=torch.bool), kl_coef=v)),
    ("progress", lambda v: do.tree_self_distill_schedule(v)),
]


@pytest.mark.parametrize("value", [NAN, INF, -INF])
@pytest.mark.parametrize(("name", "call"), NONFINITE_CASES)
def test_nonfinite_coefficients_raise_naming_the_argument(name: str, call: Callable[[float], Any],
                                                          value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number, got {value}"):
        call(value)


def test_dpo_beta_nan_was_a_nan_loss_and_finite_values_still_work() -> None:
    # the fault of #25: beta=nan gave tensor(nan). Policy = reference gives log 2 for any beta.
    assert _dpo(beta=0.1).item() == pytest.approx(math.log(2))
    assert do.grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0])).tolist() == pytest.approx(
        [1 / math.sqrt(2), -1 / math.sqrt(2)], abs=1e-5)


def test_tensor_coefficients_are_not_read() -> None:
    # a tensor argument is passed through: no host sync in the check (its value stays the caller's)
    out = _dpo(beta=0.1, length_normalizer=torch.tensor(2.0))
    assert out.item() == pytest.approx(math.log(2))


def test_grpo_with_eps_zero_gives_all_equal_groups_zero_advantage() -> None:
    # issue #38 L2: (r - mean) / (std + 0) was 0 / 0 = NaN for a group of equal scores.
    # Group 0 = [1, 1]: advantage 0; group 1 = [1, 0]: mean 0.5, unbiased std sqrt(0.5), so +-0.5 / 0.7071.
    adv = do.grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), eps=0.0)
    assert adv.tolist() == pytest.approx([0.0, 0.0, 1 / math.sqrt(2), -1 / math.sqrt(2)], abs=1e-6)
    assert do.grpo_advantages(torch.full((3, 2), 7.0), torch.zeros(3, dtype=torch.long), eps=0.0).eq(0).all()


def test_grpo_refuses_a_negative_eps() -> None:
    with pytest.raises(ValueError, match=r"^eps must be >= 0.*got -0.5"):
        do.grpo_advantages(Z3, G3, eps=-0.5)


@pytest.mark.parametrize("value", [0.0, -4.0])
def test_norm_const_must_be_positive(value: float) -> None:
    # issue #38 L2: norm_const=0 gave a -inf loss, a negative one flipped the loss's sign.
    with pytest.raises(ValueError, match=rf"^norm_const must be > 0.*got {value}"):
        _clipped(agg="seq-mean-token-sum-norm", norm_const=value)
    with pytest.raises(ValueError, match=r"^norm_const must be > 0"):
        do.aggregate(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), "seq-mean-token-sum-norm", norm_const=value)
