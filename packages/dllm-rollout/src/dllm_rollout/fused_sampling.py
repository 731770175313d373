"""One Triton kernel for a decoding step's proposal, its confidence and its log-prob.

`sampling.propose` followed by `sampling.confidence` makes about a dozen passes over [B, N, V]
float32 tensors (the tempered copy, a logsumexp, the top-k mask, the softmax, its CDF, a second
logsumexp for LLaDA's raw confidence), a sizeable share of a cached decoding step at 8B
(docs/benchmarks.md). `draw` reads the logits twice in their own dtype instead:

- pass 1, per row: the log-sum-exp of x / T over the whole vocabulary (the policy log-prob's
  normaliser), the log-sum-exp of x (LLaDA's temperature-1 confidence), and the mass Z of the
  kept tokens (x >= the row's top-k threshold, never the mask id) with its maximum;
- pass 2 (T > 0): the first kept token whose cumulative mass, in vocabulary order, reaches u * Z:
  the same inverse-CDF draw as `sampling.inverse_cdf` at the same uniform number u. At T = 0 pass 1
  also keeps the first maximal kept token (`argmax`) and pass 2 is skipped.

The top-k threshold (the k-th largest logit other than the mask id) comes from `torch.topk`; every
token tied with it is kept, as `sampling.filter_logits` keeps it. The result equals the unfused
path up to float32 rounding (summation order of the CDF, x * (1 / T) for x / T): the same tokens
except where u falls within rounding of a CDF step. Set TRITON_INTERPRET=1 before importing to run
the kernel on CPU (tests).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from dllm_models.kernels import HAS_TRITON

BLOCK_V = 4096


class Draw(NamedTuple):
    """Per-position results of `draw`, each [R].

    Attributes:
        x0: long, the proposed token.
        logp: float32, log softmax(x / T)[x0] over the whole vocabulary (mask id included).
        prob: float32, softmax(filter(x / T))[x0], the kept tokens' renormalised probability
            (Dream's and SDAR's confidence).
        raw_prob: float32, softmax(x)[x0] (LLaDA's "low_confidence").
    """

    x0: torch.Tensor
    logp: torch.Tensor
    prob: torch.Tensor
    raw_prob: torch.Tensor


if HAS_TRITON:
    import triton  # type: ignore[import-untyped,unused-ignore]
    import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

    @triton.jit  # type: ignore[untyped-decorator,unused-ignore]
    def _draw_kernel(  # type: ignore[no-untyped-def]
        X, U, KTH, X0, LOGP, PROB, RAW, stride_row, n_cols, inv_temp, mask_id,
        GREEDY: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = X + row * stride_row
        kth = tl.load(KTH + row)
        neg = float("-inf")
        m_t = tl.full((), neg, tl.float32)  # all tokens, x / T
        s_t = tl.zeros((), tl.float32)
        m_1 = tl.full((), neg, tl.float32)  # all tokens, x
        s_1 = tl.zeros((), tl.float32)
        m_k = tl.full((), neg, tl.float32)  # kept tokens, x / T
        s_k = tl.zeros((), tl.float32)
        best = tl.full((), neg, tl.float32)  # T = 0: the first maximal kept token
        best_at = tl.full((), -1, tl.int32)
        last = tl.full((), -1, tl.int32)  # the last kept token (rounding fallback of the search)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < n_cols
            x = tl.load(base + cols, mask=inside, other=neg).to(tl.float32)
            xs = x * inv_temp
            keep = inside & (x >= kth) & (cols != mask_id)
            # running log-sum-exps; a maximum still at -inf (no finite value yet) scales by 0
            m_new = tl.maximum(m_t, tl.max(xs, axis=0))
            s_t = s_t * tl.where(m_t == neg, 0.0, tl.exp(m_t - m_new)) + tl.sum(tl.exp(xs - m_new), axis=0)
            m_t = m_new
            m_new = tl.maximum(m_1, tl.max(x, axis=0))
            s_1 = s_1 * tl.where(m_1 == neg, 0.0, tl.exp(m_1 - m_new)) + tl.sum(tl.exp(x - m_new), axis=0)
            m_1 = m_new
            xk = tl.where(keep, xs, neg)
            top = tl.max(xk, axis=0)
            m_new = tl.maximum(m_k, top)
            scale = tl.where(m_k == neg, 0.0, tl.exp(m_k - m_new))
            s_k = s_k * scale + tl.sum(tl.where(keep, tl.exp(xs - m_new), 0.0), axis=0)
            m_k = m_new
            last = tl.maximum(last, tl.max(tl.where(keep, cols, -1), axis=0))
            if GREEDY:
                at = tl.min(tl.where(keep & (xk == top), cols, n_cols), axis=0)
                better = top > best
                best_at = tl.where(better, at, best_at)
                best = tl.where(better, top, best)
        if GREEDY:
            x0 = best_at
        else:
            target = tl.load(U + row) * s_k
            run = tl.zeros((), tl.float32)
            found = tl.full((), n_cols, tl.int32)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                inside = cols < n_cols
                x = tl.load(base + cols, mask=inside, other=neg).to(tl.float32)
                keep = inside & (x >= kth) & (cols != mask_id)
                p = tl.where(keep, tl.exp(x * inv_temp - m_k), 0.0)
                cdf = tl.cumsum(p, axis=0) + run
                found = tl.minimum(found, tl.min(tl.where(keep & (cdf >= target), cols, n_cols), axis=0))
                run += tl.sum(p, axis=0)
            x0 = tl.where(found < n_cols, found, last)
        # no kept token (non-finite logits): propose the mask id, so the decoder's progress check
        # reports the logits instead of committing garbage
        x0 = tl.where(x0 < 0, tl.maximum(mask_id, 0), x0)
        xv = tl.load(base + x0).to(tl.float32)
        tl.store(X0 + row, x0.to(tl.int64))
        tl.store(LOGP + row, xv * inv_temp - m_t - tl.log(s_t))
        tl.store(PROB + row, tl.exp(xv * inv_temp - m_k) / s_k)
        tl.store(RAW + row, tl.exp(xv - m_1) / s_1)


def top_k_threshold(logits: torch.Tensor, top_k: int | None, mask_id: int | None) -> torch.Tensor:
    """The k-th largest logit of each row [R, V] other than the mask id, float32 [R] (-inf: keep all).

    `filter_logits` keeps every token >= this value (ties included) once the mask id is at -inf.
    """
    r, v = logits.shape
    if top_k is None or top_k >= v:
        return torch.full((r,), float("-inf"), dtype=torch.float32, device=logits.device)
    if mask_id is None or top_k + 1 > v:
        return logits.topk(top_k, dim=-1).values[:, -1].float()
    values, indices = logits.topk(top_k + 1, dim=-1)
    # the mask among the k largest: the k-th largest other token is the (k+1)-th
    masked = (indices[:, :top_k] == mask_id).any(-1)
    return torch.where(masked, values[:, top_k], values[:, top_k - 1]).float()


def draw(logits: torch.Tensor, u: torch.Tensor | None, *, temperature: float, top_k: int | None,
         mask_id: int | None) -> Draw:
    """Proposal, confidences and log-prob of each row of `logits` in one kernel (see module doc).

    Args:
        logits: [R, V] (any float dtype; rows contiguous).
        u: [R] float32 uniform numbers in (0, 1), one per row (None at temperature 0).
        temperature: T; 0 proposes the argmax (and reads probabilities at T = 1, as `propose` does).
        top_k: keep the k largest logits (None: all); mask_id: never proposed (None: no such token).
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; decode with dllm_rollout.sampling.propose")
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits must be a row-contiguous [R, V] tensor; got {tuple(logits.shape)} "
                         f"(strides {logits.stride()})")
    greedy = temperature == 0.0
    if not greedy and (u is None or u.shape != logits.shape[:1]):
        raise ValueError(f"u must be [R] = [{logits.shape[0]}] at temperature {temperature}; got "
                         f"{None if u is None else tuple(u.shape)}")
    r, v = logits.shape
    kth = top_k_threshold(logits, top_k, mask_id)
    x0 = torch.empty(r, dtype=torch.long, device=logits.device)
    logp, prob, raw = (torch.empty(r, dtype=torch.float32, device=logits.device) for _ in range(3))
    if r:
        kernel: Any = _draw_kernel
        kernel[(r,)](logits, kth if u is None else u.float().contiguous(), kth, x0, logp, prob, raw,
                     logits.stride(0), v, 1.0 / (temperature if temperature > 0 else 1.0),
                     -1 if mask_id is None else mask_id, GREEDY=greedy, BLOCK=BLOCK_V)
    return Draw(x0, logp, prob, raw)
