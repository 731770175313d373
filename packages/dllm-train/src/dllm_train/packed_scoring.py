"""The fast likelihood path: packed rows, a training attention backend, no [tokens, vocab] logits.

The padded path of `Scorer` runs every row at the batch's full width and materialises float32
logits [M, S, V]; for block-diffusion families it even runs one row per noised block. Here the
real tokens of all rows are packed into one row (`dllm_models.packing`), the model runs with the
training attention backend (`varlen` / `flash_attn` for bidirectional families, `bd3lm_kernel`
(the Triton kernel of `dllm_models.kernels.bd3lm_attention`) or `flex` for the BD3LM layout of
block families) and token log-probs come from the fused head
(`dllm_models.logprob.token_logprobs`: Triton on CUDA, chunked on CPU). The result is the same
function as the padded path (tests compare them); only padding compute and logits memory go.

Switch it on with `Scorer(model, attention="varlen")` (or "flex", "sdpa", ...): the rollout keeps
the model's own backend, the scorer switches to the training one around its forwards.

Block families share the clean context: consecutive rows with the same real tokens and clean
sequence (the Monte-Carlo copies of one sequence, the replayed states of one trajectory) form one
segment [x_0 ; x_t^1 ; ... ; x_t^k] with one clean half, each noisy copy seeing its own copy and
the shared clean half exactly as in its own [x_t ; x_0] pair (`dllm_models.bd3lm_mask(copies=)`):
(k + 1) L tokens instead of 2 k L, and the same function. `shared=False` gives every row its own
clean half (the doubled layout, for comparison).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

Readout = Callable[..., torch.Tensor]
"""What a packed forward returns per position: `(model, input_ids, targets, *, temperature,
**forward_kwargs) -> [B, L]`, 0 where `targets < 0`. The default is the fused log-prob head
(`dllm_models.logprob.model_token_logprobs`); a value model's scorer reads its values instead
(`dllm_train.critic.position_values`)."""

PACKED_BACKENDS = ("sdpa", "eager", "flex", "varlen", "flash_attn", "bd3lm_kernel")


def shares_clean_context(attention_mask: torch.Tensor, clean_ids: torch.Tensor) -> torch.Tensor:
    """bool [M]: row i has real tokens, the same real positions and the same clean tokens as row i - 1.

    Such a row joins its predecessor's segment of the shared-clean BD3LM layout (see module doc).

    Args:
        attention_mask: [M, S] bool, real tokens.
        clean_ids: [M, S] clean sequence of each row.
    """
    attn = attention_mask.bool()
    out = torch.zeros(attn.shape[0], dtype=torch.bool, device=attn.device)
    if attn.shape[0] > 1:
        same_real = (attn[1:] == attn[:-1]).all(-1)
        same_clean = ((clean_ids[1:] == clean_ids[:-1]) | ~attn[1:]).all(-1)
        out[1:] = same_real & same_clean & attn[1:].any(-1)
    return out


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
    shared: bool = True,
    noised_only: bool = True,
    readout: Readout | None = None,
) -> torch.Tensor:
    """float32 [M, S] log-prob of `targets` given `noisy_ids`, computed on packed rows (see module doc).

    Padding positions get 0. Block families (`block_length` set): BD3LM layout, each noised block
    sees itself and the clean earlier blocks; blocks without a noised token get 0 (as the padded
    path: block ids noised in no row of the batch). `shared`: consecutive rows with the same clean
    context share one clean half (`shares_clean_context`); False: one clean half per row.
    `noised_only` (block families): score only the noised positions of each noisy copy (input
    differs from the clean sequence) -- the output head and log-softmax run there alone, never on
    the clean copy -- and give 0 elsewhere; False: every position of a noised block. `readout`:
    what the forward returns per position (`Readout`; None: the log-probs of `targets`).
    """
    from dllm_models.logprob import model_token_logprobs
    from dllm_models.packing import pack, pack_like, unpack

    read = model_token_logprobs if readout is None else readout
    attn = attention_mask.bool()
    packed = pack(noisy_ids, attn)
    tgt = pack_like(targets, packed)  # [1, T]
    if block_length is None:
        lp = read(
            model, packed.input_ids, tgt, temperature=temperature,
            attention=packed.attention_mask(), position_ids=packed.position_ids, attention_backend=backend,
        )
        return unpack(lp, packed)
    follows = shares_clean_context(attn, clean_ids) if shared else torch.zeros_like(attn[:, 0])
    return _bd3lm(model, packed, clean_ids, follows, tgt, temperature, block_length, noised_only, backend, read)


class BD3LMLayout(NamedTuple):
    """The packed BD3LM row of a batch of rows (see `bd3lm_layout`).

    Attributes:
        input_ids: [1, N] the row: per group of rows its clean copy, then every row's noisy copy.
        attention: its `AttentionMask` (`dllm_models.bd3lm_mask(copies=...)`).
        noisy_at: long [T] index in the row of each packed token's noisy copy.
    """

    input_ids: torch.Tensor
    attention: Any
    noisy_at: torch.Tensor


def bd3lm_layout(packed: Any, clean_ids: torch.Tensor, follows: torch.Tensor, block_length: int) -> BD3LMLayout:
    """The shared-clean BD3LM row of packed rows: [x_0 ; x_t^1 ; ... ; x_t^k] per group of rows.

    A row that does not follow its predecessor (`follows` False) starts a group: its clean copy,
    then its noisy copy; each following row (same real positions and clean tokens) adds its noisy
    copy to the group's segment. All False: [x_0 ; x_t] per row (the doubled layout).

    Args:
        packed: `dllm_models.packing.Packed` of the noisy rows [M, S].
        clean_ids: [M, S] clean sequence of each row.
        follows: bool [M] (`shares_clean_context`, or all False).
        block_length: the family's block size.
    """
    from dllm_models.attention import bd3lm_mask
    from dllm_models.packing import pack_like

    clean = pack_like(clean_ids, packed)[0]
    noisy = packed.input_ids[0]
    cu = packed.cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]  # [M] real tokens of each row
    device = noisy.device
    lead = ~follows.to(device)
    size = lengths * (1 + lead.long())  # a lead row's slot holds its clean copy too
    slot = size.cumsum(0) - size
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    offset = torch.arange(noisy.numel(), device=device) - cu[:-1][seq]
    noisy_at = (slot + lead.long() * lengths)[seq] + offset
    ids = torch.empty(int(size.sum()), dtype=noisy.dtype, device=device)
    ids[noisy_at] = noisy
    own_clean = lead[seq]
    ids[(slot[seq] + offset)[own_clean]] = clean[own_clean]  # the group's clean copy heads its segment
    group = lead.long().cumsum(0) - 1
    copies = torch.zeros(len(lengths), dtype=torch.long, device=device).index_add_(0, group, torch.ones_like(group))
    keep = lead & (lengths > 0)
    mask = bd3lm_mask(lengths[keep].tolist(), block_length, copies=copies[group[keep]].tolist(), device=device)
    return BD3LMLayout(ids[None], mask, noisy_at)


def _bd3lm(model: Any, packed: Any, clean_ids: torch.Tensor, follows: torch.Tensor, tgt: torch.Tensor,
           temperature: float, block_length: int, noised_only: bool, backend: str, read: Readout) -> torch.Tensor:
    """Log-probs of the rows' targets on their noisy copies in the BD3LM layout (`bd3lm_layout`).

    The head runs only where a target is set (`model_token_logprobs` skips -100): never on the
    clean copies, and with `noised_only` only on the noised positions of the noisy copies.
    """
    from dllm_models.packing import pack_like, unpack

    layout = bd3lm_layout(packed, clean_ids, follows, block_length)
    noisy_at = layout.noisy_at
    targets = torch.full((layout.input_ids.shape[1],), -100, dtype=tgt.dtype, device=noisy_at.device)
    scored = tgt[0]
    if noised_only:
        scored = torch.where(packed.input_ids[0] != pack_like(clean_ids, packed)[0], scored, -100)
    targets[noisy_at] = scored
    lp2 = read(model, layout.input_ids, targets[None], temperature=temperature,
                               attention=layout.attention, attention_backend=backend)
    lp = lp2[0, noisy_at]
    # the blocks of a sequence that hold none of its noised tokens score 0, as on the padded path
    noisy, clean = packed.input_ids[0], pack_like(clean_ids, packed)[0]
    cu = packed.cu_seqlens.long()
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1, device=cu.device), cu[1:] - cu[:-1])
    block = torch.div(packed.position_ids[0], block_length, rounding_mode="floor")
    nblocks = int(block.max()) + 1 if block.numel() else 1
    key = seq * nblocks + block
    has = torch.zeros((len(cu) - 1) * nblocks, dtype=torch.long, device=noisy.device)
    has.index_add_(0, key, (noisy != clean).long())
    lp = torch.where(has[key] > 0, lp, torch.zeros_like(lp))
    return unpack(lp[None], packed)
