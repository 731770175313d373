"""The fast likelihood path: packed rows, a training attention backend, no [tokens, vocab] logits.

The padded path of `Scorer` runs every row at the batch's full width and materialises float32
logits [M, S, V]; for block-diffusion families it even runs one row per noised block. Here the
real tokens of all rows are packed into one row (`dllm_models.packing`), the model runs with the
training attention backend (`varlen` / `flash_attn` for bidirectional families, `flex` for the
BD3LM [x_t ; x_0] layout of block families) and token log-probs come from the fused head
(`dllm_models.logprob.token_logprobs`: Triton on CUDA, chunked on CPU). The result is the same
function as the padded path (tests compare them); only padding compute and logits memory go.

Switch it on with `Scorer(model, attention="varlen")` (or "flex", "sdpa", ...): the rollout keeps
the model's own backend, the scorer switches to the training one around its forwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

PACKED_BACKENDS = ("sdpa", "eager", "flex", "varlen", "flash_attn")


@contextmanager
def _backend(model: Any, name: str) -> Iterator[None]:
    old = getattr(model, "attention_backend", "sdpa")
    model.attention_backend = name
    try:
        yield
    finally:
        model.attention_backend = old


def packed_token_logp(
    model: Any,
    noisy_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    clean_ids: torch.Tensor,
    *,
    temperature: float,
    block_length: int | None,
    backend: str,
) -> torch.Tensor:
    """float32 [M, S] log-prob of `targets` given `noisy_ids`, computed on packed rows (see module doc).

    Padding positions get 0. Block families (`block_length` set): BD3LM layout, each noised block
    sees itself and the clean earlier blocks; blocks without a noised token get 0 (as the padded
    path: block ids noised in no row of the batch).
    """
    from dllm_models.logprob import model_token_logprobs
    from dllm_models.packing import pack, pack_like, unpack

    attn = attention_mask.bool()
    packed = pack(noisy_ids, attn)
    tgt = pack_like(targets, packed)  # [1, T]
    with _backend(model, backend):
        if block_length is None:
            lp = model_token_logprobs(
                model, packed.input_ids, tgt, temperature=temperature,
                attention=packed.attention_mask(), position_ids=packed.position_ids,
            )
            return unpack(lp, packed)
        return _bd3lm(model, packed, attn, clean_ids, tgt, temperature, block_length)


def _bd3lm(model: Any, packed: Any, attn: torch.Tensor, clean_ids: torch.Tensor, tgt: torch.Tensor,
           temperature: float, block_length: int) -> torch.Tensor:
    """BD3LM [x_t ; x_0] rows of every sequence packed into one row, scored on the x_t halves."""
    from dllm_models.attention import bd3lm_mask
    from dllm_models.logprob import model_token_logprobs
    from dllm_models.packing import pack_like, unpack

    clean = pack_like(clean_ids, packed)[0]
    noisy = packed.input_ids[0]
    cu = packed.cu_seqlens.long()
    lengths = (cu[1:] - cu[:-1]).tolist()
    nonempty = [n for n in lengths if n > 0]
    device = noisy.device
    # layout: per sequence its noisy copy, then its clean copy
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), cu[1:] - cu[:-1])
    start = cu[:-1][seq]  # per token: its sequence's first packed index
    noisy_at = start + torch.arange(noisy.numel(), device=device)  # = 2 * start + offset in the sequence
    ids = torch.empty(2 * noisy.numel(), dtype=noisy.dtype, device=device)
    ids[noisy_at] = noisy
    ids[noisy_at + (cu[1:] - cu[:-1])[seq]] = clean  # the clean copy follows the noisy one
    targets = torch.full((2 * noisy.numel(),), -100, dtype=tgt.dtype, device=device)
    targets[noisy_at] = tgt[0]
    mask = bd3lm_mask(nonempty, block_length, device=device)
    lp2 = model_token_logprobs(model, ids[None], targets[None], temperature=temperature, attention=mask)
    lp = lp2[0, noisy_at]
    # the blocks of a sequence that hold none of its noised tokens score 0, as on the padded path
    block = torch.div(packed.position_ids[0], block_length, rounding_mode="floor")
    nblocks = int(block.max()) + 1 if block.numel() else 1
    key = seq * nblocks + block
    has = torch.zeros(len(lengths) * nblocks, dtype=torch.long, device=device)
    has.index_add_(0, key, (noisy != clean).long())
    lp = torch.where(has[key] > 0, lp, torch.zeros_like(lp))
    return unpack(lp[None], packed)
