"""The padded path's head in chunks: the same log-probs and gradients as the logits in one piece,
and never more than one chunk of [tokens, vocabulary] logits at a time (forward and backward)."""

from __future__ import annotations

import pytest
import torch

from dllm_models.logprob import LOGITS_CHUNK_ELEMENTS, output_head
from dllm_train.likelihood import Scorer
from tests.dllm_models.tiny_configs import MASK, VOCAB, build_tiny

FAMILIES = ["llada", "Dream", "sdar", "llada2_moe"]  # llada2: logits_fp32; Dream: logit shift


def _model(family: str) -> torch.nn.Module:
    overrides = {"mask_token_id": MASK, "vocab_size": VOCAB, "embedding_size": VOCAB} if family == "llada" else {}
    return build_tiny(family, seed=1, **overrides).double().train()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded clean ids [3, 14] (random, so a token read at the wrong position changes its
    log-prob), attention mask, and a noised copy."""
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(0, 60, (3, 14), generator=g)
    attn = torch.ones(3, 14, dtype=torch.bool)
    attn[0, :5] = False
    attn[1, :2] = False
    noise = (torch.rand(3, 14, generator=g) < 0.5) & attn
    noise[:, -1] = True
    return clean, attn, torch.where(noise, torch.full_like(clean, MASK), clean)


def _score_and_grads(family: str, chunk: int, targets_fn: str = "clean") -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = _model(family)
    clean, attn, noisy = _batch()
    targets = clean
    if targets_fn == "candidates":  # [M, S, C]: the clean token and two others
        targets = torch.stack([clean, (clean + 7) % 60, (clean * 3) % 60], -1)
    scorer = Scorer(model, logits_chunk_tokens=chunk)
    lp = scorer(noisy, attn, targets, clean_ids=clean)
    weights = torch.linspace(-1.0, 2.0, lp.numel(), dtype=lp.dtype).view_as(lp)  # every position counts apart
    (lp * weights).sum().backward()
    return lp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("targets", ["clean", "candidates"])
def test_chunked_head_equals_one_piece_in_float64(family: str, targets: str) -> None:
    # 42 tokens in chunks of 5 (the last one 2 tokens; 17 for the block families' rows per noised block)
    whole, g_whole = _score_and_grads(family, 10**9, targets)
    chunked, g_chunked = _score_and_grads(family, 5, targets)
    assert whole.dtype == torch.float64 and (whole != 0).any()
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
    assert len(g_whole) == len(g_chunked) > 0
    for a, b in zip(g_chunked, g_whole):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_mis_stitched_chunk_is_caught() -> None:
    """The comparison above sees a chunk put back one token off (so it can fail)."""
    whole, _ = _score_and_grads("sdar", 10**9)
    chunked, _ = _score_and_grads("sdar", 5)
    flat = chunked.flatten().clone()
    flat[5:10] = flat[4:9].clone()  # the second chunk shifted by one position
    assert not torch.allclose(flat.view_as(whole), whole, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_the_head_never_sees_more_than_a_chunk(family: str) -> None:
    model = _model(family)
    clean, attn, noisy = _batch()
    rows: list[int] = []
    head = output_head(model)
    handle = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    try:
        lp = Scorer(model, logits_chunk_tokens=4)(noisy, attn, clean, clean_ids=clean)
        lp.sum().backward()  # the recomputation in backward goes through the head again
        with torch.no_grad():
            Scorer(model, logits_chunk_tokens=4)(noisy, attn, clean, clean_ids=clean)
    finally:
        handle.remove()
    assert rows and max(rows) <= 4
    tokens = sum(rows)
    assert tokens % 3 == 0 and tokens > 2 * noisy.numel()  # forward, backward recomputation, no-grad pass


def test_the_default_chunk_follows_the_vocabulary() -> None:
    model = _model("sdar")
    assert Scorer(model)._chunk_tokens() == LOGITS_CHUNK_ELEMENTS // VOCAB
    with pytest.raises(ValueError, match="logits_chunk_tokens"):
        Scorer(model, logits_chunk_tokens=0)


@pytest.mark.parametrize(("family", "expected"), [("llada", None), ("Dream", None), ("sdar", "sdpa"),
                                                  ("llada2_moe", "sdpa")])
def test_cpu_auto_scores_block_families_on_packed_rows(family: str, expected: str | None) -> None:
    """On CPU "auto" keeps LLaDA/Dream padded and packs SDAR/LLaDA2: their padded layout runs a
    full-width row per noised block, which the token budget cannot split."""
    from dllm_train import TrainerConfig, resolved_attention

    model = _model(family)
    assert resolved_attention(TrainerConfig(), model) == expected
    assert resolved_attention(TrainerConfig(train_attention="none"), model) is None


@pytest.mark.parametrize(("block_length", "expected"), [(None, "varlen"), (4, "bd3lm_kernel")])
def test_cuda_auto_picks_varlen_or_the_bd3lm_kernel(block_length: int | None, expected: str) -> None:
    """On CUDA "auto" is the measured fast path: varlen for bidirectional families, the BD3LM kernel
    for block families (docs/benchmarks.md: sdar-bgpo's update 404 s with it, 514 s with flex)."""
    from types import SimpleNamespace

    from dllm_train import TrainerConfig, resolved_attention

    on_cuda = SimpleNamespace(device=torch.device("cuda"))
    model = SimpleNamespace(traits=SimpleNamespace(block_length=block_length), parameters=lambda: iter([on_cuda]))
    assert resolved_attention(TrainerConfig(), model) == expected
    assert resolved_attention(TrainerConfig(train_attention="flex"), model) == "flex"
