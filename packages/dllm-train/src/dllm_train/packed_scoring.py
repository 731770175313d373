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

Noisy copies carry only their noised blocks. In the BD3LM mask a noisy block is read by the
queries of its own copy and block alone (clean queries never see noisy keys), and a block of a
row holding none of that row's noised tokens scores 0; so those blocks (the prompt's always, and
with one mask count per copy drawn uniformly, about 1/5 of the response's) are left out of the row
(`noised_block_tokens`, `dllm_models.bd3lm_mask(keep=)`), with explicit position ids: the same
function with fewer tokens. A segment is then x_0 plus its copies' kept tokens, which is what
`Scorer.row_cost` prices. Tests: `tests/dllm_train/test_packed_scoring.py::
test_noised_blocks_only_is_the_whole_layout_and_the_padded_path` (float64 log-probs and parameter
gradients equal the whole-copy layout and the padded path; the forward's token count),
`tests/dllm_train/test_shared_context.py` (hidden states in four layouts; every pass runs its
priced tokens).
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
    noised_blocks_only: bool = True,
) -> torch.Tensor:
    """float32 [M, S] log-prob of `targets` given `noisy_ids`, computed on packed rows (see module doc).

    Padding positions get 0. Block families (`block_length` set): BD3LM layout, each noised block
    sees itself and the clean earlier blocks; blocks without a noised token get 0 (as the padded
    path: block ids noised in no row of the batch). `shared`: consecutive rows with the same clean
    context share one clean half (`shares_clean_context`); False: one clean half per row.
    `noised_only` (block families): score only the noised positions of each noisy copy (input
    differs from the clean sequence) -- the output head and log-softmax run there alone, never on
    the clean copy -- and give 0 elsewhere; False: every position of a noised block.
    `noised_blocks_only` (block families): each noisy copy carries only its blocks that hold a
    noised token (`bd3lm_layout`); False: every copy whole (the same values, more tokens; for
    comparison). `readout`: what the forward returns per position (`Readout`; None: the log-probs
    of `targets`).
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
    return _bd3lm(model, packed, clean_ids, follows, tgt, temperature, block_length, noised_only, backend,
                  noised_blocks_only, read)


def noised_block_tokens(packed: Any, clean: torch.Tensor, block_length: int) -> torch.Tensor:
    """bool [T]: the packed tokens whose block holds a noised token of their own sequence.

    Noised: the input differs from the clean sequence. Blocks are numbered from each sequence's
    position 0 (`packed.position_ids // block_length`). Only these blocks of a noisy copy are
    scored (the others score 0, as on the padded path) or read by a scored query (a noisy block
    is seen by its own queries alone), so the layout keeps them and drops the rest.

    Args:
        packed: `dllm_models.packing.Packed` of the noisy rows [M, S].
        clean: [T] the clean tokens, packed alike.
        block_length: the family's block size.
    """
    noisy = packed.input_ids[0]
    rows = len(packed.cu_seqlens) - 1
    seq = packed.attention_mask().segment_ids(noisy.device)
    assert seq is not None  # a packed row has cu_seqlens
    block = torch.div(packed.position_ids[0], block_length, rounding_mode="floor")
    nblocks = int(block.max()) + 1 if block.numel() else 1
    key = seq * nblocks + block
    has = torch.zeros(rows * nblocks, dtype=torch.long, device=noisy.device)
    has.index_add_(0, key, (noisy != clean).long())
    out: torch.Tensor = has[key] > 0
    return out


def noised_block_counts(noisy_ids: torch.Tensor, attention_mask: torch.Tensor, clean_ids: torch.Tensor,
                        block_length: int) -> torch.Tensor:
    """long [M]: tokens of each row's noisy copy in the BD3LM layout (`noised_block_tokens`).

    Args:
        noisy_ids, clean_ids: [M, S] noisy and clean rows.
        attention_mask: [M, S] bool, real tokens.
        block_length: the family's block size.
    """
    from dllm_models.packing import pack, pack_like

    packed = pack(noisy_ids, attention_mask)
    kept = noised_block_tokens(packed, pack_like(clean_ids, packed)[0], block_length)
    seq = packed.attention_mask().segment_ids(kept.device)
    assert seq is not None
    return torch.zeros(len(packed.cu_seqlens) - 1, dtype=torch.long, device=kept.device).index_add_(0, seq, kept.long())


class BD3LMLayout(NamedTuple):
    """The packed BD3LM row of a batch of rows (see `bd3lm_layout`).

    Attributes:
        input_ids: [1, N] the row: per group of rows its clean copy, then every row's noisy copy
            (its noised blocks only).
        attention: its `AttentionMask` (`dllm_models.bd3lm_mask(copies=..., keep=...)`).
        position_ids: [1, N] position of each token of the row in its sequence.
        noisy_at: long [T] index in the row of each packed token's noisy copy, -1 where its block
            holds no noised token of its sequence (left out of the row).
    """

    input_ids: torch.Tensor
    attention: Any
    position_ids: torch.Tensor
    noisy_at: torch.Tensor


def bd3lm_layout(packed: Any, clean_ids: torch.Tensor, follows: torch.Tensor, block_length: int, *,
                 noised_blocks_only: bool = True) -> BD3LMLayout:
    """The shared-clean BD3LM row of packed rows: [x_0 ; x_t^1 ; ... ; x_t^k] per group of rows.

    A row that does not follow its predecessor (`follows` False) starts a group: its clean copy,
    then its noisy copy; each following row (same real positions and clean tokens) adds its noisy
    copy to the group's segment. All False: [x_0 ; x_t] per row (the doubled layout). A noisy
    copy carries only its blocks that hold a noised token of its own (`noised_block_tokens`): the
    others are read by no scored query and score 0, so leaving them out changes no value and no
    gradient. Every clean copy stays whole (it keeps each pass's cost a sum over rows, see
    `dllm_train.Scorer.row_cost`).

    Args:
        packed: `dllm_models.packing.Packed` of the noisy rows [M, S].
        clean_ids: [M, S] clean sequence of each row.
        follows: bool [M] (`shares_clean_context`, or all False).
        block_length: the family's block size.
        noised_blocks_only: False keeps every noisy copy whole (the layout before the drop, for
            comparison: the same values at the kept positions).
    """
    from dllm_models.attention import bd3lm_mask
    from dllm_models.packing import pack_like

    clean = pack_like(clean_ids, packed)[0]
    noisy = packed.input_ids[0]
    cu = packed.cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]  # [M] real tokens of each row
    device = noisy.device
    lead = ~follows.to(device)
    # the whole layout first (every copy whole), then the positions kept
    size = lengths * (1 + lead.long())  # a lead row's slot holds its clean copy too
    slot = size.cumsum(0) - size
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    offset = torch.arange(noisy.numel(), device=device) - cu[:-1][seq]
    whole_at = (slot + lead.long() * lengths)[seq] + offset
    own_clean = lead[seq]
    clean_at = (slot[seq] + offset)[own_clean]  # the group's clean copy heads its segment
    total = int(size.sum())
    ids = torch.empty(total, dtype=noisy.dtype, device=device)
    ids[whole_at], ids[clean_at] = noisy, clean[own_clean]
    pos = torch.empty(total, dtype=torch.long, device=device)
    pos[whole_at], pos[clean_at] = offset, offset[own_clean]
    kept = (noised_block_tokens(packed, clean, block_length) if noised_blocks_only
            else torch.ones_like(noisy, dtype=torch.bool))
    keep = torch.zeros(total, dtype=torch.bool, device=device)
    keep[clean_at] = True
    keep[whole_at] = kept
    group = lead.long().cumsum(0) - 1
    copies = torch.zeros(len(lengths), dtype=torch.long, device=device).index_add_(0, group, torch.ones_like(group))
    heads = lead & (lengths > 0)
    mask = bd3lm_mask(lengths[heads].tolist(), block_length, copies=copies[group[heads]].tolist(), keep=keep,
                      device=device)
    row_at = keep.long().cumsum(0) - 1  # index in the kept row
    noisy_at = torch.where(kept, row_at[whole_at], torch.full_like(whole_at, -1))
    return BD3LMLayout(ids[keep][None], mask, pos[keep][None], noisy_at)


def _bd3lm(model: Any, packed: Any, clean_ids: torch.Tensor, follows: torch.Tensor, tgt: torch.Tensor,
           temperature: float, block_length: int, noised_only: bool, backend: str,
           noised_blocks_only: bool, read: Readout) -> torch.Tensor:
    """Log-probs of the rows' targets on their noisy copies in the BD3LM layout (`bd3lm_layout`).

    The head runs only where a target is set (`model_token_logprobs` skips -100): never on the
    clean copies, and with `noised_only` only on the noised positions of the noisy copies. The
    blocks of a row that hold none of its noised tokens score 0, as on the padded path (and are
    not in the layout with `noised_blocks_only`).
    """
    from dllm_models.packing import pack_like, unpack

    layout = bd3lm_layout(packed, clean_ids, follows, block_length, noised_blocks_only=noised_blocks_only)
    clean = pack_like(clean_ids, packed)[0]
    kept = noised_block_tokens(packed, clean, block_length) if not noised_blocks_only else layout.noisy_at >= 0
    at = layout.noisy_at.clamp(min=0)
    targets = torch.full((layout.input_ids.shape[1],), -100, dtype=tgt.dtype, device=at.device)
    scored = tgt[0]
    if noised_only:
        scored = torch.where(packed.input_ids[0] != clean, scored, -100)
    targets[at[kept]] = scored[kept]
    lp2 = read(model, layout.input_ids, targets[None], temperature=temperature,
               attention=layout.attention, position_ids=layout.position_ids, attention_backend=backend)
    lp = torch.where(kept, lp2[0, at], torch.zeros((), dtype=lp2.dtype, device=lp2.device))
    return unpack(lp[None], packed)
