"""Per-row device noise (`dllm_rollout.noise`) and the inverse-CDF token draw built on it."""

from __future__ import annotations

import math

import pytest
import torch

from dllm_rollout.noise import RowNoise, mix64
from dllm_rollout.sampling import inverse_cdf, propose

U64 = (1 << 64) - 1


def _mix_reference(x: int) -> int:
    """SplitMix64's output function on Python integers (unbounded, masked to 64 bits)."""
    x &= U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & U64
    return x ^ (x >> 31)


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def test_mix64_is_splitmix64_bit_for_bit() -> None:
    words = [0, 1, 2, 12345, -1, -(1 << 63), (1 << 63) - 1, 0x0123456789ABCDEF, -0x5555555555555555]
    got = mix64(torch.tensor(words, dtype=torch.long)).tolist()
    assert got == [_signed(_mix_reference(w & U64)) for w in words]
    # the published SplitMix64 stream of seed 1234567 (state += golden ratio, then mix)
    state, out = 1234567, []
    for _ in range(2):
        state = (state + 0x9E3779B97F4A7C15) & U64
        out.append(_mix_reference(state))
    assert out == [6457827717110365317, 3203168211198807973]


def test_uniform_lies_in_the_open_unit_interval_and_is_uniform() -> None:
    noise = RowNoise(torch.tensor([0, 1, 2, 3]))
    u = noise.uniform((50_000,), torch.ones(4, dtype=torch.bool))
    assert u.dtype == torch.float32 and bool((u > 0).all()) and bool((u < 1).all())
    counts = torch.histc(u.flatten(), bins=20, min=0.0, max=1.0)
    expected = u.numel() / 20
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 60.0  # 19 degrees of freedom: p < 1e-5 beyond 50
    # neighbouring numbers and neighbouring seeds are uncorrelated
    for a, b in ((u[:, :-1], u[:, 1:]), (u[0], u[1])):
        r = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]
        assert abs(float(r)) < 0.02


def test_a_row_draws_the_same_alone_or_in_a_batch_and_only_while_active() -> None:
    seeds = torch.tensor([11, 22, 33])
    batch = RowNoise(seeds)
    alone = RowNoise(seeds[1:2])
    steps = [torch.tensor([True, True, False]), torch.tensor([False, False, True]), torch.tensor([True, True, True])]
    mine = []
    for active in steps:
        u = batch.uniform((2, 3), active)
        assert u.shape == (3, 2, 3)
        assert bool((u[~active] == 0.5).all())
        if bool(active[1]):
            mine.append(u[1])
    assert batch.drawn.tolist() == [12, 12, 12]
    for u in mine:
        assert torch.equal(alone.uniform((2, 3), torch.tensor([True]))[0], u)
    # successive draws differ, and so do rows
    assert not torch.equal(mine[0], mine[1])


def test_inverse_cdf_draws_from_the_softmax() -> None:
    logits = torch.tensor([1.0, 0.0, float("-inf"), 2.0, -1.0])
    n = 40_000
    noise = RowNoise(torch.arange(n))
    x = inverse_cdf(torch.softmax(logits, -1).expand(n, 1, -1), noise.uniform((1,), torch.ones(n, dtype=torch.bool)))
    freq = torch.bincount(x.flatten(), minlength=5).double() / n
    p = torch.softmax(logits.double(), -1)
    assert float(freq[2]) == 0.0  # zero mass is never drawn
    sigma = (p * (1 - p) / n).sqrt()
    assert bool(((freq - p).abs() <= 5 * sigma + 1e-12).all()), (freq, p)


def test_propose_samples_the_tempered_filtered_softmax_and_its_logp() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 1, 12, generator=g) * 2
    n, t = 30_000, 0.7
    noise = RowNoise(torch.arange(n) + 7)
    x0, _, logp = propose(logits.expand(n, 1, -1), temperature=t, top_k=5, top_p=None, noise=noise,
                          active=torch.ones(n, dtype=torch.bool), mask_id=None, keep_probs=False)
    kept = logits[0, 0].topk(5).indices
    p = torch.zeros(12, dtype=torch.float64)
    p[kept] = torch.softmax(logits[0, 0, kept].double() / t, -1)
    freq = torch.bincount(x0.flatten(), minlength=12).double() / n
    assert bool((freq[p == 0] == 0).all())
    sigma = (p * (1 - p) / n).sqrt()
    assert bool(((freq - p).abs() <= 5 * sigma + 1e-12).all()), (freq, p)
    # logp is the unfiltered tempered log-prob of the drawn token
    full = torch.log_softmax(logits[0, 0] / t, -1)
    torch.testing.assert_close(logp[:, 0], full[x0[:, 0]], rtol=0, atol=1e-5)


def test_mask_id_is_never_proposed() -> None:
    logits = torch.zeros(64, 2, 6)
    logits[..., 3] = 5.0  # the mask id is the most likely token
    noise = RowNoise(torch.arange(64))
    x0, _, _ = propose(logits, temperature=1.0, top_k=None, top_p=None, noise=noise,
                       active=torch.ones(64, dtype=torch.bool), mask_id=3)
    assert not bool((x0 == 3).any())


@pytest.mark.gpu
def test_cuda_draws_the_same_numbers_as_the_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    seeds = torch.tensor([5, 9, 2**40 + 3])
    active = torch.tensor([True, False, True])
    cpu, gpu = RowNoise(seeds), RowNoise(seeds, "cuda")
    for shape in ((7,), (3, 129)):
        assert torch.equal(cpu.uniform(shape, active), gpu.uniform(shape, active.cuda()).cpu())
    assert math.prod((3, 129)) + 7 == int(gpu.drawn[0])
