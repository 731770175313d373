"""The torch fused head keeps float64 inputs in float64 (values and gradients), as the padded path does."""

from __future__ import annotations

import torch

from dllm_models.logprob import default_chunk_tokens, naive_token_logprobs, token_logprobs


def test_float64_inputs_give_float64_log_probs_and_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 8, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (11,), generator=g)
    targets[3] = -100
    out = token_logprobs(hidden, weight, targets, chunk_size=4, backend="chunked")
    ref = naive_token_logprobs(hidden, weight, targets)
    assert out.dtype == ref.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13)  # float32 anywhere would be ~1e-7 off
    w = torch.linspace(-1, 1, 11, dtype=torch.float64)
    grads = torch.autograd.grad((out * w).sum(), (hidden, weight))
    ref_grads = torch.autograd.grad((ref * w).sum(), (hidden, weight))
    for a, b in zip(grads, ref_grads):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_the_default_chunk_bounds_the_logits_of_a_large_vocabulary() -> None:
    assert default_chunk_tokens(64, triton=False) == 2048  # small vocabularies: one chunk as before
    assert default_chunk_tokens(151_936, triton=False) == 2**26 // 151_936 == 441
    assert default_chunk_tokens(151_936, triton=True) == 2048
