"""Logits-free token log-probabilities: log softmax(h W^T / T)[target] without [N, V] logits.

The tokens are processed in chunks of `chunk_size`; a custom autograd function keeps only the
float32 log-sum-exp per token and recomputes each chunk's logits in backward, so memory stays
O(chunk_size x V) instead of O(N x V) (the idea of Liger's fused linear cross-entropy, Hsu et al.,
arXiv 2410.10989). On CUDA the per-chunk log-sum-exp and gradient are Triton kernels
(`dllm_models.kernels`); elsewhere plain torch, whose float32 temporaries are [chunk, V] each: its
default chunk holds at most `LOGITS_CHUNK_ELEMENTS` logits.

Models give their final hidden states through `final_hidden`: every family's own
`model.final_hidden(...)` method (so packed rows and the BD3LM layout go through `attention=`),
else, for wrapped modules without it, a pre-forward hook on the output head that stops the forward
before the head runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

_HEAD_PATHS = ("lm_head", "model.transformer.ff_out", "transformer.ff_out", "model.lm_head")

TRITON_CHUNK_TOKENS = 2048
"""Default tokens per chunk of the Triton head."""
LOGITS_CHUNK_ELEMENTS = 2**26
"""Most logits (tokens x vocabulary) a torch (non-Triton) head computes at once by default:
256 MiB of float32 per temporary."""


def default_chunk_tokens(vocab: int, *, triton: bool) -> int:
    """Tokens per head chunk: `TRITON_CHUNK_TOKENS` for the Triton kernels, else as many as
    `LOGITS_CHUNK_ELEMENTS` logits allow at vocabulary size `vocab` (at most that too)."""
    if triton:
        return TRITON_CHUNK_TOKENS
    return max(1, min(TRITON_CHUNK_TOKENS, LOGITS_CHUNK_ELEMENTS // max(1, vocab)))


def _chunk_lse_target(
    logits: torch.Tensor, targets: torch.Tensor, inv_temp: float, use_triton: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton:
        from dllm_models.kernels import lse_and_target

        return lse_and_target(logits, targets, inv_temp)
    x = logits.to(_value_dtype(logits.dtype)) * inv_temp
    return torch.logsumexp(x, -1), x.gather(-1, targets.clamp(min=0)[:, None])[:, 0]


def _chunk_grad(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g: torch.Tensor,
    inv_temp: float, use_triton: bool,
) -> torch.Tensor:
    """d(sum g * logprob)/d logits for one chunk, in the logits' dtype."""
    if use_triton:
        from dllm_models.kernels import logprob_grad_

        return logprob_grad_(logits, targets, lse, g, inv_temp)
    d = torch.exp(logits.to(lse.dtype) * inv_temp - lse[:, None]).neg_()
    d.scatter_add_(-1, targets.clamp(min=0)[:, None], torch.ones_like(d[:, :1]))
    return (d * (g * inv_temp)[:, None]).to(logits.dtype)


class _ChunkedLogProb(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
        chunk: int, inv_temp: float, use_triton: bool,
    ) -> torch.Tensor:
        n = hidden.shape[0]
        dtype = _value_dtype(hidden.dtype)
        out = torch.empty(n, dtype=dtype, device=hidden.device)
        lse = torch.empty(n, dtype=dtype, device=hidden.device)
        for s in range(0, n, chunk):
            logits = hidden[s:s + chunk] @ weight.T
            lse[s:s + chunk], tgt = _chunk_lse_target(logits, targets[s:s + chunk], inv_temp, use_triton)
            out[s:s + chunk] = tgt - lse[s:s + chunk]
        valid = targets >= 0
        out = torch.where(valid, out, torch.zeros_like(out))
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk, ctx.inv_temp, ctx.use_triton = chunk, inv_temp, use_triton
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = torch.where(targets >= 0, grad_out.to(lse.dtype), torch.zeros_like(grad_out, dtype=lse.dtype))
        d_hidden = torch.empty_like(hidden) if need_h else None
        # accumulated in the weight's dtype, one rounding per chunk (as Liger does)
        d_weight = torch.zeros_like(weight) if need_w else None
        chunk = ctx.chunk
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            logits = h @ weight.T
            d = _chunk_grad(logits, targets[s:s + chunk], lse[s:s + chunk], g[s:s + chunk],
                            ctx.inv_temp, ctx.use_triton)
            if d_hidden is not None:
                torch.mm(d, weight, out=d_hidden[s:s + chunk])
            if d_weight is not None:
                d_weight.addmm_(d.T, h)
        return d_hidden, d_weight, None, None, None, None


def _value_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for float64 inputs (the log-softmax never runs below float32)."""
    return torch.promote_types(dtype, torch.float32)


def _has_triton() -> bool:
    from dllm_models.kernels import HAS_TRITON  # imports Triton: only asked for CUDA inputs

    return HAS_TRITON


def naive_token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0
) -> torch.Tensor:
    """Reference: log_softmax((hidden @ weight.T) / T)[targets] in float32 or float64 (materialises [N, V])."""
    logits = hidden @ weight.T
    logp = torch.log_softmax(logits.to(_value_dtype(logits.dtype)) / temperature, dim=-1)
    out = logp.gather(-1, targets.clamp(min=0)[:, None])[:, 0]
    return torch.where(targets >= 0, out, torch.zeros_like(out))


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Log-probability of each target token under softmax(hidden @ weight.T / temperature).

    Args:
        hidden: [N, H] final hidden states (after the final norm).
        weight: [V, H] output-head weight.
        targets: long [N] target ids; negative ids (e.g. -100) give 0 and no gradient.
        chunk_size: tokens per chunk; peak extra memory is a few chunk_size x V logits (None:
            `default_chunk_tokens`, 2048 for Triton, at most `LOGITS_CHUNK_ELEMENTS` logits else).
        temperature: logits are divided by it (the sampling temperature of the rollout).
        backend: 'auto' (Triton on CUDA when available, else chunked torch), 'triton',
            'chunked' or 'naive' (the reference, materialises [N, V]).

    Returns:
        float32 [N] log-probabilities (float64 for float64 inputs), differentiable w.r.t. hidden
        and weight.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got {tuple(hidden.shape)}, {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N] = [{hidden.shape[0]}], got {tuple(targets.shape)}")
    if (chunk_size is not None and chunk_size < 1) or temperature <= 0:
        raise ValueError(f"chunk_size must be >= 1 and temperature > 0, got {chunk_size}, {temperature}")
    if backend == "naive":
        return naive_token_logprobs(hidden, weight, targets, temperature=temperature)
    if backend == "auto":
        backend = "triton" if hidden.is_cuda and _has_triton() else "chunked"
    if backend not in ("triton", "chunked"):
        raise ValueError(f"backend must be one of 'auto', 'triton', 'chunked', 'naive'; got {backend!r}")
    triton = backend == "triton"
    if chunk_size is None:
        chunk_size = default_chunk_tokens(weight.shape[0], triton=triton)
    hidden = hidden.contiguous()
    out: torch.Tensor = _ChunkedLogProb.apply(
        hidden, weight, targets.long(), chunk_size, 1.0 / temperature, triton
    )
    return out


def output_head(model: nn.Module) -> nn.Module:
    """The output (LM head) module of a family: `get_output_embeddings()` or a known path."""
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        head = getter()
        if isinstance(head, nn.Module):
            return head
    for path in _HEAD_PATHS:
        try:
            head = model.get_submodule(path)
        except AttributeError:
            continue
        return head
    raise ValueError(
        f"cannot find the output head of {type(model).__name__}: expose get_output_embeddings() "
        f"or one of the submodules {list(_HEAD_PATHS)}"
    )


class _StopForward(Exception):
    pass


def final_hidden(model: nn.Module, input_ids: torch.Tensor, **forward_kwargs: Any) -> torch.Tensor:
    """Final hidden states [B, L, H] (input of the output head) of one forward pass.

    Uses `model.final_hidden(input_ids, **forward_kwargs)` when the family defines it; otherwise
    runs `model(input_ids, **forward_kwargs)` with a pre-forward hook on the output head that
    captures its input and stops the pass, so the [B, L, V] logits are never computed.
    """
    method = getattr(model, "final_hidden", None)
    if callable(method):
        out = method(input_ids, **forward_kwargs)
        assert isinstance(out, torch.Tensor)
        return out
    captured: list[torch.Tensor] = []

    def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(args[0])
        raise _StopForward

    handle = output_head(model).register_forward_pre_hook(hook)
    try:
        model(input_ids, **forward_kwargs)
    except _StopForward:
        pass
    finally:
        handle.remove()
    if not captured:
        raise RuntimeError(f"{type(model).__name__}.forward never called its output head")
    return captured[0]


def shift_hidden(hidden: torch.Tensor, attention: Any = None) -> torch.Tensor:
    """Hidden states read with a shift of one: position j gets state j - 1, the first position of
    every row keeps its own (`cat(h[:, :1], h[:, :-1])`). On a packed row (`attention` with
    `cu_seqlens`) the shift restarts at every sequence, so it never crosses sequences."""
    cu = getattr(attention, "cu_seqlens", None)
    n = hidden.shape[1]
    if cu is None:
        return torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)
    src = torch.arange(n, device=hidden.device) - 1
    starts = cu[:-1].to(device=hidden.device, dtype=torch.long) - (int(cu[-1]) - n)
    starts = starts[(starts >= 0) & (starts < n)]
    src[starts] = starts
    src[0] = 0
    return hidden[:, src]


def lm_head_and_hidden(
    model: nn.Module, input_ids: torch.Tensor, **forward_kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden [B, L, H], head weight [V, H]) with the family's logit shift already applied.

    With `traits.logit_shift == 1` (Dream) the prediction for position j is read from hidden
    state j - 1, so hidden is shifted right by one (position 0 keeps its own state), matching
    `cat(logits[:, :1], logits[:, :-1])`; on a packed row (`attention=` with `cu_seqlens`) the
    shift restarts at every sequence (`shift_hidden`).
    """
    hidden = final_hidden(model, input_ids, **forward_kwargs)
    traits = getattr(model, "traits", None)
    if traits is not None and traits.logit_shift == 1:
        hidden = shift_hidden(hidden, forward_kwargs.get("attention"))
    weight = getattr(output_head(model), "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"output head of {type(model).__name__} has no weight tensor")
    return hidden, weight


def model_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """Per-token log p(targets | input_ids) of a diffusion LM without [B, L, V] logits.

    Args:
        model: a family module (see `final_hidden` for what it must offer).
        input_ids: [B, L] (noised) inputs.
        targets: long [B, L] target ids; negative ids (-100) are skipped (0, no gradient, and
            no head matmul): pass -100 wherever no log-prob is needed (prompt, padding).
        chunk_size, temperature: see `token_logprobs`.
        forward_kwargs: passed to `final_hidden` (attention_mask, position_ids, attention=
            for packed rows [1, T] or the BD3LM layout, ...).

    Returns:
        float32 [B, L] log-probabilities (float64 for a float64 model; 0 where targets < 0).
    """
    hidden, weight = lm_head_and_hidden(model, input_ids, **forward_kwargs)
    b, n, h = hidden.shape
    flat_t = targets.reshape(-1)
    keep = (flat_t >= 0).nonzero().squeeze(-1)
    lp = token_logprobs(
        hidden.reshape(b * n, h)[keep], weight, flat_t[keep],
        chunk_size=chunk_size, temperature=temperature,
    )
    out = torch.zeros(b * n, dtype=lp.dtype, device=hidden.device).index_copy(0, keep, lp)
    return out.view(b, n)
