"""Token proposals, confidences and position selection shared by every decoder.

Randomness is per sample: row b draws only from its own stream of `noise` (a `RowNoise`), and only
while it is active, so a sample decodes the same in any batch (replay). Nothing here reads a value
back to the host, so a step's sampling can run inside a CUDA graph.
"""

from __future__ import annotations

import torch

from dllm_models.kernels import runs_on
from dllm_rollout import fused_sampling
from dllm_rollout.noise import RowNoise

NEG_INF = float("-inf")


def filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Set logits outside the top-p (nucleus) set, then outside the top-k, to -inf (Dream's order).

    Args:
        logits: [..., V] float.
        top_k: keep the k largest (None: all).
        top_p: keep the smallest prefix of the sorted distribution whose mass reaches top_p; the
            token that crosses top_p is kept (Holtzman et al. 2020; Dream's `top_p_logits`).

    Returns:
        [..., V] logits with removed entries at -inf.
    """
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(-1) - probs
        remove_sorted = before > top_p
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, NEG_INF)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    return logits


def propose(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    noise: RowNoise,
    active: torch.Tensor,
    mask_id: int | None = None,
    keep_probs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Propose a token per position.

    Temperature 0 takes the argmax of the (filtered) logits; T > 0 samples from
    softmax(filter(logits / T)) by inverting its CDF at one uniform number per position (equal in
    law to LLaDA's Gumbel-max draw, docs/generation.md#llada, and to Dream's categorical draw).
    The log-prob is read as (logits / T)[x0] - logsumexp(logits / T): one reduction instead of a
    [B, N, V] log-softmax.

    Args:
        logits: [B, N, V] model logits (any float dtype).
        active: [B] bool, rows that draw noise this step.
        mask_id: never proposed (a random or early checkpoint can put mass on it, which would
            leave a committed position masked).
        keep_probs: return the [B, N, V] probabilities (computed once for the draw and the caller);
            False where no confidence reads them (`RAW_CONFIDENCES`): the draw then reuses their memory.

    Returns:
        x0: [B, N] proposals; probs: [B, N, V] float32 softmax(filter(logits / T)) (T=1 at T=0), the
        distribution every Dream confidence reads (None without `keep_probs`); logp: [B, N] float32
        log-prob of x0 under the unfiltered softmax(logits / T) (T=1 at T=0): the policy log-prob a
        trainer recomputes.
    """
    t = temperature if temperature > 0 else 1.0
    scaled = logits.float() / t  # a fresh float32 tensor: the edits below are in place
    lse = torch.logsumexp(scaled, dim=-1)
    if mask_id is not None:
        scaled[..., mask_id] = NEG_INF  # no host-to-device index copy (a sync)
    filtered = filter_logits(scaled, top_k, top_p)
    probs = torch.softmax(filtered, dim=-1) if keep_probs or temperature > 0 else None
    if temperature == 0.0:
        x0 = filtered.argmax(dim=-1)
    else:
        assert probs is not None
        x0 = inverse_cdf(probs, noise.uniform(tuple(filtered.shape[1:-1]), active), overwrite=not keep_probs)
    # `scaled` still holds the unfiltered logits (the filters return new tensors) except at the mask
    # id, which x0 never is (its logit is -inf while every row keeps a finite one)
    logp = scaled.gather(-1, x0[..., None]).squeeze(-1) - lse
    return x0, probs if keep_probs else None, logp


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, *, overwrite: bool = False) -> torch.Tensor:
    """Index drawn from the distribution `probs` [..., V] by inverting its CDF at u [...] in (0, 1).

    The first index whose cumulative mass reaches u times the total: entries of mass 0 (-inf
    logits) are never drawn, and one binary search per position replaces the [..., V] noise of
    Gumbel-max. `overwrite` accumulates the CDF in `probs` itself (when the caller is done with it).
    """
    cdf = probs.cumsum_(dim=-1) if overwrite else probs.cumsum(dim=-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


# the probability of the proposal under softmax(logits / T) before top-k / top-p: exp(logp)
TEMPERED = "low_confidence_dynamic"
RAW_CONFIDENCES = ("low_confidence", "random", TEMPERED)  # confidences that never read `probs`
FUSED_CONFIDENCES = ("maskgit_plus", "origin", *RAW_CONFIDENCES)  # confidences `fused_sampling` returns


def fuses(logits: torch.Tensor, remasking: str, top_p: float | None, *, fused: bool = True) -> bool:
    """Whether `propose_scored` takes the fused kernel for these logits and settings: `fused` on (the
    config's `speed.fused_sampling`), on CUDA with Triton (or CPU under TRITON_INTERPRET=1), a
    confidence the kernel returns, and no nucleus filter (it needs a sort)."""
    return (fused and runs_on(logits) and remasking in FUSED_CONFIDENCES
            and (top_p is None or top_p >= 1.0))


def propose_scored(
    logits: torch.Tensor,
    *,
    remasking: str,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    noise: RowNoise,
    active: torch.Tensor,
    mask_id: int | None = None,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`propose` then `confidence(remasking, ...)`: proposals x0 [B, N], their confidences [B, N] and
    log-probs [B, N], drawing the same noise in the same order. "low_confidence_dynamic"'s
    confidence is exp(logp): the proposal's probability under softmax(logits / T) before top-k /
    top-p (T=1 at temperature 0), as SGLang's `sample_block_tokens` and lmdeploy's unmasking score it.

    Where `fuses` holds, one Triton kernel (`fused_sampling.draw`) reads the logits twice instead
    of the dozen [B, N, V] float32 passes of the unfused path; it equals that path up to float32
    rounding (tested), and the unfused path runs everywhere else (and with `fused=False`, the
    config's `speed.fused_sampling`).
    """
    if not fuses(logits, remasking, top_p, fused=fused):
        x0, probs, logp = propose(logits, temperature=temperature, top_k=top_k, top_p=top_p, noise=noise,
                                  active=active, mask_id=mask_id, keep_probs=remasking not in RAW_CONFIDENCES)
        if remasking == TEMPERED:
            return x0, logp.exp(), logp
        return x0, confidence(remasking, logits, probs, x0, noise, active), logp
    shape = tuple(logits.shape[1:-1])
    u = noise.uniform(shape, active).reshape(-1) if temperature > 0 else None
    out = fused_sampling.draw(logits.reshape(-1, logits.shape[-1]), u, temperature=temperature, top_k=top_k,
                              mask_id=mask_id)
    x0 = out.x0.view(-1, *shape)
    if remasking == "random":  # its own noise, drawn after the proposals' as in the unfused path
        conf = confidence(remasking, logits, None, x0, noise, active)
    elif remasking == TEMPERED:
        conf = out.logp.exp().view(-1, *shape)
    else:
        conf = (out.raw_prob if remasking == "low_confidence" else out.prob).view(-1, *shape)
    return x0, conf, out.logp.view(-1, *shape)


def confidence(
    remasking: str,
    logits: torch.Tensor,
    probs: torch.Tensor | None,
    x0: torch.Tensor,
    noise: RowNoise,
    active: torch.Tensor,
) -> torch.Tensor:
    """Confidence [B, N] of each proposal (higher = commit first).

    "low_confidence": softmax(raw logits) at x0 (LLaDA: temperature 1, unfiltered);
    "random": U(0,1); Dream (docs/generation.md#dream) from the filtered, tempered `probs`:
    "maskgit_plus" p(x0), "topk_margin" p(top1) - p(top2), "entropy" sum p log(p + 1e-10) (negative
    entropy, with Dream's epsilon).
    """
    if remasking == "low_confidence":
        raw = logits.float()
        return torch.exp(raw.gather(-1, x0[..., None]).squeeze(-1) - torch.logsumexp(raw, dim=-1))
    if remasking == "random":
        return noise.uniform(tuple(x0.shape[1:]), active)
    if probs is None:
        raise ValueError(f"remasking {remasking!r} reads the proposal probabilities: pass `probs`")
    if remasking in ("maskgit_plus", "origin"):
        return probs.gather(-1, x0[..., None]).squeeze(-1)
    if remasking == "topk_margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if remasking == "entropy":  # Dream's epsilon (generation_utils.py `sample_tokens`)
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    raise ValueError(f"remasking {remasking!r} has no confidence")


def select(
    conf: torch.Tensor,
    candidates: torch.Tensor,
    k: torch.Tensor,
    threshold: float | None = None,
) -> torch.Tensor:
    """Positions [B, N] to commit among `candidates`.

    Without threshold: the k[b] most confident candidates of row b (ties: lower index first).
    With threshold: every candidate with confidence >= threshold, plus the k[b] most confident
    (so k >= 1 guarantees progress).

    Args:
        conf: [B, N] confidences; candidates: [B, N] bool; k: [B] long.
    """
    conf = conf.float().masked_fill(~candidates, NEG_INF)
    order = conf.sort(dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(conf.shape[-1], device=conf.device).expand_as(order))
    chosen = rank < k[:, None]
    if threshold is not None:
        chosen = chosen | (conf >= threshold)
    return chosen & candidates


def select_above(conf: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor, threshold: float) -> torch.Tensor:
    """Positions [B, N] to commit under DARE's threshold rule: every candidate with confidence
    strictly above `threshold`, plus the k[b] most confident of row b (ties: lower index first).

    With k = 1 this is SGLang's `LowConfidence` (above the threshold, else the single best) and
    lmdeploy's `low_confidence_dynamic` (which compares with >=); with LLaDA2's quota k it is LLaDA2's
    `generate` (all above the threshold if at least k are, else the k best), docs/generation.md#threshold-rule.

    Args:
        conf: [B, N] confidences; candidates: [B, N] bool; k: [B] long.
    """
    chosen = select(conf, candidates, k) | (conf.float() > threshold)
    return chosen & candidates


def sample_positions(
    conf: torch.Tensor,
    candidates: torch.Tensor,
    k: torch.Tensor,
    alg_temp: float,
    noise: RowNoise,
    active: torch.Tensor,
) -> torch.Tensor:
    """k[b] candidates per row drawn without replacement from softmax(conf / alg_temp) (Dream).

    Gumbel-top-k: adding Gumbel noise to conf / alg_temp and taking the top k samples without
    replacement from that softmax (Kool et al. 2019).
    """
    u = noise.uniform(tuple(conf.shape[1:]), active)
    gumbel = -torch.log(-torch.log(u))
    return select(conf.float() / alg_temp + gumbel, candidates, k)
