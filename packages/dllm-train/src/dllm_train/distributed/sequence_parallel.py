"""Ulysses sequence parallelism: shard the sequence, all-to-all to heads around attention.

Jacobs et al., "DeepSpeed Ulysses", arXiv 2309.14509. Each of N ranks holds L/N positions of every
sequence. Every layer runs its projections, norms and MLP on its own positions; RoPE is applied
with the *global* position ids of those positions (RoPE is per position, so rotating before the
exchange equals rotating after gathering the full sequence). Around attention an all-to-all turns
q, k, v [B, H, L/N, D] into [B, H/N, L, D] (all positions, a slice of the heads), attention runs
over the full sequence with the full mask, and a second all-to-all turns the output back.

Installed from outside the model: `sequence_parallel(model, group)` registers a wrapping backend in
`dllm_models.attention.BACKENDS`, and the sharded forwards name it per call (`attention_backend=`), so
the families need no code change and the model's own backend is never swapped. KV heads are repeated to the query head count first when N does not divide them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from dllm_models.attention import BACKENDS, AttentionMask
from dllm_models.layers import DEFAULT_KERNELS, KernelConfig, positions_from_mask
from dllm_train.likelihood import Scorer, logp_of_targets

_counter = itertools.count()


def _a2a(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)  # contiguous too (empty_like keeps x's strides)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_head(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """[B, H, L/N, D] -> [B, H/N, L, D] (rank r keeps heads [r H/N, (r+1) H/N))."""
    n = dist.get_world_size(group)
    b, h, s, d = x.shape
    send = x.reshape(b, n, h // n, s, d).permute(1, 0, 2, 3, 4)
    recv = _a2a(send, group)  # [N (source rank = sequence chunk), B, H/N, L/N, D]
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)


def _head_to_seq(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """[B, H/N, L, D] -> [B, H, L/N, D]; the inverse of `_seq_to_head`."""
    n = dist.get_world_size(group)
    b, hl, length, d = x.shape
    send = x.reshape(b, hl, n, length // n, d).permute(2, 0, 1, 3, 4)
    recv = _a2a(send, group)  # [N (source rank = head group), B, H/N, L/N, D]
    return recv.permute(1, 0, 2, 3, 4).reshape(b, n * hl, length // n, d)


class _SeqToHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _seq_to_head(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _head_to_seq(grad, ctx.group), None


class _HeadToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _head_to_seq(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _seq_to_head(grad, ctx.group), None


def _all_gather_seq(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 1; backward keeps this rank's slice of the gradient, times `scale`
    (the loss on the gathered tensor is computed identically on every rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup | None, scale: float) -> torch.Tensor:
        ctx.group, ctx.local, ctx.scale = group, x.shape[1], scale
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        r = dist.get_rank(ctx.group)
        own = grad[:, r * ctx.local:(r + 1) * ctx.local]
        return (own * ctx.scale if ctx.scale != 1.0 else own).contiguous(), None, None


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                    grad_scale: float = 1.0) -> torch.Tensor:
    """[B, L/N, ...] -> [B, L, ...] across the group, differentiable (backward: own slice).

    Args:
        grad_scale: multiplies the backward slice. 1: the per-rank parameter gradients *sum* to
            the unsplit one. N (the group size): they *average* to it, which is what a
            data-parallel wrapper averaging over every rank (FSDP2) needs.
    """
    out: torch.Tensor = _GatherSeq.apply(x, group, grad_scale)
    return out


def _full_mask(mask: AttentionMask, batch: int, local_len: int, device: torch.device,
               group: dist.ProcessGroup | None) -> AttentionMask:
    """The mask over the gathered sequence (memoised in `mask.cache`, shared by all layers)."""
    key = ("ulysses", id(group))
    if key in mask.cache:
        out: AttentionMask = mask.cache[key]
        return out
    if mask.cu_seqlens is not None:
        raise ValueError("sequence parallelism does not support packed (cu_seqlens) masks; use padded batches")
    pad = mask.key_padding
    if pad is None:  # every rank joins the gather: a rank without padding sends ones
        pad = torch.ones((batch, local_len), dtype=torch.bool, device=device)
    full_pad = _all_gather_seq(pad.to(device=device, dtype=torch.bool), group)
    blocks = None if mask.block_ids is None else _all_gather_seq(mask.block_ids.to(device), group)
    clean = None if mask.is_clean is None else _all_gather_seq(mask.is_clean.to(device), group)
    out = AttentionMask(key_padding=None if bool(full_pad.all()) else full_pad, block_ids=blocks, is_clean=clean)
    mask.cache[key] = out
    return out


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *,
                      inner: str, group: dist.ProcessGroup | None,
                      kernels: KernelConfig | None = None) -> torch.Tensor:
    """Attention over the full sequence from sequence-sharded q [B, Hq, L/N, D], k, v [B, Hkv, L/N, D],
    the full-sequence attention run by backend `inner` with `kernels` (None: its defaults).

    Returns:
        [B, Hq, L/N, D], equal to this rank's rows of unsharded attention.
    """
    n = dist.get_world_size(group)
    if q.shape[2] != k.shape[2]:
        raise ValueError("sequence parallelism does not support a KV cache (Lq != Lk); decode unsharded")
    hq, hkv = q.shape[1], k.shape[1]
    if hq % n:
        raise ValueError(f"sequence parallel size {n} must divide the number of attention heads ({hq})")
    if hkv % n:  # repeat KV heads before the exchange (DARE's llada.py monkey patch does the same)
        k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    full = _full_mask(mask, q.shape[0], q.shape[2], q.device, group)
    qf, kf, vf = (_SeqToHead.apply(t, group) for t in (q, k, v))
    out = BACKENDS[inner](qf, kf, vf, full) if kernels is None else BACKENDS[inner](qf, kf, vf, full, kernels)
    res: torch.Tensor = _HeadToSeq.apply(out, group)
    return res


def register_ulysses_backend(group: dist.ProcessGroup | None, inner: str) -> str:
    """Register a Ulysses backend over `group` around `inner` in `BACKENDS`; returns its name."""
    if inner not in BACKENDS:
        raise ValueError(f"inner attention backend {inner!r} unknown; choose one of {sorted(BACKENDS)}")
    name = f"ulysses{next(_counter)}:{inner}"

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask,
           kernels: KernelConfig = DEFAULT_KERNELS) -> torch.Tensor:
        return ulysses_attention(q, k, v, mask, inner=inner, group=group, kernels=kernels)

    BACKENDS[name] = fn
    return name


@contextmanager
def sequence_parallel(model: Any, group: dist.ProcessGroup | None = None,
                      inner: str | None = None) -> Iterator[str]:
    """A Ulysses backend over `group` registered for the block; yields its name, which a forward inside
    the block takes as `model(..., attention_backend=name)` (the model's own backend is not changed).

    Args:
        model: a dllm_models family with an `attention_backend` attribute (LLaDA, SDAR, Dream ...).
        group: the sequence-parallel process group (None: the default group).
        inner: backend doing the full-sequence attention (default: the model's own backend).
    """
    name = register_ulysses_backend(group, inner or model.attention_backend)
    try:
        yield name
    finally:
        del BACKENDS[name]


def shard_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's contiguous chunk of dim 1 (L must be divisible by the group size)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[1] % n:
        raise ValueError(f"sequence length {x.shape[1]} is not divisible by the group size {n}; pad it")
    s = x.shape[1] // n
    return x[:, r * s:(r + 1) * s]


def sp_forward(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, *,
               group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sequence-parallel forward: the full logits [B, L, V], equal to `model(input_ids, ...)`.

    Every rank passes the same full inputs; each runs the model on its L/N positions (padded at
    the end to a multiple of N with masked keys), and the logits are gathered. Gradients of
    parameters are partial per rank: sum them over `group` (for a loss computed identically on
    every rank) to get the unsharded gradient.

    Args:
        input_ids: [B, L]; attention_mask: [B, L] (1 on real tokens) or None.
        position_ids: [B, L] global positions (default: counted from each row's first real token).
    """
    n = dist.get_world_size(group)
    b, length = input_ids.shape
    mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    if position_ids is None:
        position_ids = positions_from_mask(mask)
    pad = (-length) % n
    if pad:
        ids = torch.cat([input_ids, input_ids.new_zeros(b, pad)], dim=1)
        mask = torch.cat([mask, mask.new_zeros(b, pad)], dim=1)
        extra = position_ids[:, -1:] + torch.arange(1, pad + 1, device=position_ids.device)
        position_ids = torch.cat([position_ids, extra], dim=1)
    else:
        ids = input_ids
    local_ids, local_mask, local_pos = (shard_sequence(t, group) for t in (ids, mask, position_ids))
    with sequence_parallel(model, group) as backend:
        # key_padding must be given whenever any rank pads: pass the bool mask always
        logits = model(local_ids, attention_mask=local_mask, position_ids=local_pos, attention_backend=backend).logits
    return gather_sequence(logits, group)[:, :length]


def _pad_tail(x: torch.Tensor, pad: int, value: int | bool) -> torch.Tensor:
    """[M, S, ...] -> [M, S + pad, ...], the new positions filled with `value`."""
    return torch.cat([x, x.new_full((x.shape[0], pad, *x.shape[2:]), value)], dim=1)


class SequenceParallelScorer(Scorer):
    """A `Scorer` whose forward runs Ulysses-style over a sequence-parallel group.

    Every rank of `group` passes the same full rows (old, reference and training passes alike);
    each runs the model on its contiguous L/N positions (the rows padded at the end to a multiple
    of N with masked keys; RoPE and block ids from global positions, so a block straddling two
    ranks and the BD3LM rows are split consistently) and takes the log-probs of those positions;
    only the float32 log-probs [M, L] are all-gathered, never the logits. Every rank then holds
    the unsplit values, and the objective's loss is computed identically on all of them.

    Gradients: the gather's backward keeps this rank's slice times N, so averaging parameter
    gradients over all data-parallel x sequence-parallel ranks (the FSDP2 reduce-scatter over
    the world) gives the mean over data-parallel groups of each group's unsplit gradient.

    Args:
        model: a dllm_models family (FSDP2-sharded or not) with an `attention_backend`.
        group: the sequence-parallel process group of this rank.
        lockstep_group: see `Scorer` (the FSDP2 group, spanning every sequence-parallel group).
    """

    def __init__(self, model: Any, group: dist.ProcessGroup | None, *,
                 lockstep_group: dist.ProcessGroup | None = None) -> None:
        super().__init__(model, lockstep_group=lockstep_group)
        if self.logit_shift not in (0, 1):
            raise ValueError(f"sequence parallelism supports a logit shift of 0 or 1, got {self.logit_shift}")
        self.group = group
        self.size = dist.get_world_size(group)
        # registered for the scorer's lifetime: activation recomputation in backward looks it up
        self.backend = register_ulysses_backend(group, model.attention_backend)

    def __call__(self, noisy_ids: torch.Tensor, attention_mask: torch.Tensor, targets: torch.Tensor, *,
                 clean_ids: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
        """`Scorer.__call__` with every forward split over the group (padded rows only)."""
        if self.attention is not None:
            raise ValueError("sequence parallelism splits padded rows; packed training attention is not "
                             "supported with it: unset it on the model or use sequence_parallel=1")
        return super().__call__(noisy_ids, attention_mask, targets, clean_ids=clean_ids, temperature=temperature)

    def _token_logp(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor,
                    temperature: float) -> torch.Tensor:
        s = ids.shape[1]
        tgt = targets
        if self.logit_shift:
            # position j is read at logit j - 1 (and 0 at 0): each position scores its own target
            # (needed at 0) and the next one; both are gathered and recombined below
            nxt = torch.cat([targets[:, 1:], targets[:, -1:]], dim=1)
            tgt = torch.stack([targets, nxt], -1) if targets.dim() == 2 else torch.cat([targets, nxt], -1)
        pad = (-s) % self.size
        if pad:
            extra = pos[:, -1:] + torch.arange(1, pad + 1, device=pos.device)
            ids, attn, tgt = _pad_tail(ids, pad, self.pad_id), _pad_tail(attn, pad, False), _pad_tail(tgt, pad, 0)
            pos = torch.cat([pos, extra], dim=1)
        local = [shard_sequence(t, self.group) for t in (ids, attn, pos, tgt)]
        logits = self.model(local[0], attention_mask=local[1], position_ids=local[2],
                            attention_backend=self.backend).logits
        lp = gather_sequence(logp_of_targets(logits, local[3], temperature), self.group,
                             grad_scale=float(self.size))[:, :s]
        if not self.logit_shift:
            return lp
        if targets.dim() == 2:
            return torch.cat([lp[:, :1, 0], lp[:, :-1, 1]], dim=1)
        c = targets.shape[-1]
        return torch.cat([lp[:, :1, :c], lp[:, :-1, c:]], dim=1)


__all__ = [
    "SequenceParallelScorer",
    "gather_sequence",
    "register_ulysses_backend",
    "sequence_parallel",
    "shard_sequence",
    "sp_forward",
    "ulysses_attention",
]
