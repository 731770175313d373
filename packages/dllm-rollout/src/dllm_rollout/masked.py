"""Masked-diffusion decoding (LLaDA, Dream) in semi-autoregressive blocks, with Fast-dLLM caches.

- LLaDA low-confidence / random remasking: Nie et al., "Large Language Diffusion Models"
  (arXiv 2502.09992), Algorithm 5; quota per block as in docs/generation.md#llada.
- Dream's origin / maskgit_plus / topk_margin / entropy with the 1 - s/t schedule: Ye et al.,
  "Dream 7B" (arXiv 2508.15487), `generation_utils.py` (docs/generation.md#dream).
- Prefix and dual KV caches and confidence-threshold parallel decoding: Wu et al., "Fast-dLLM"
  (arXiv 2505.22618) (docs/generation.md#fast-dllm). Both caches are approximations for
  bidirectional models: the cached keys are not refreshed when tokens of the current block are
  committed.
"""

from __future__ import annotations

from typing import Any

import torch
from dllm_models.layers import positions_from_mask
from dllm_models.protocol import KVCache

from dllm_rollout.batch import RolloutBatch, decoded_batch
from dllm_rollout.config import LLADA_REMASKING, SamplingConfig
from dllm_rollout.graphs import GraphedStep, graph_pool
from dllm_rollout.head import block_forward, raw_columns
from dllm_rollout.noise import RowNoise
from dllm_rollout.prediction import full_prediction, record_noise, response_logits
from dllm_rollout.progress import check_progress
from dllm_rollout.record import Recorder
from dllm_rollout.sampling import propose_scored, sample_positions, select

DREAM_EPS = 1e-3


def transfer_quota(num_masked: int, steps: int) -> list[int]:
    """Tokens to commit at each of `steps` steps: base m // steps, the first m % steps get one more."""
    base, extra = divmod(num_masked, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def shifted(logits: torch.Tensor, shift: int) -> torch.Tensor:
    """Logits whose column j predicts position j (Dream reads position j at j - 1)."""
    if shift:
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


def full_logits(model: Any, canvas: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[B, L, V] logits of one full forward, column j predicting position j."""
    out: torch.Tensor = model(canvas, attention_mask=attn, position_ids=pos).logits
    return shifted(out, model.traits.logit_shift)


class _BlockLogits:
    """Logits [B, bl, V] of the current block at each step, under the configured cache.

    Step 0 of a block is always one full forward (which also fills the cache); later steps
    forward the window [start - shift, L) against the prefix cache ("prefix") or the block only
    against prefix and (stale) suffix caches ("dual").

    The cached steps read and write fixed buffers: the canvas-wide cache that the first full
    forward allocates is rewritten in place by every later one (`KVCache.write_columns`), so no
    block start allocates a new cache, and the dual step and each block's prefix step keep their
    shapes and buffers and replay as CUDA graphs (`GraphedStep`; a no-op off CUDA). Full forwards
    (every no-cache step, every block start) run eagerly: at batch 64 even a 2,048-token dual step
    is bound by the GPU, not by kernel launches (docs/benchmarks.md), and a full forward is 16
    times larger.

    `release()` drops the cache and the graphs as soon as decoding ends (each graph holds a bound
    method of this object: a reference cycle that would keep the cache alive until the next
    garbage collection, into the trainer's update).
    """

    def __init__(self, model: Any, cfg: SamplingConfig, canvas: torch.Tensor, attn: torch.Tensor,
                 pos: torch.Tensor) -> None:
        self.model, self.cfg, self.canvas, self.pos = model, cfg, canvas, pos
        self.shift = int(model.traits.logit_shift)
        bl = cfg.block_length
        # the full forwards' mask, None when every column is real: read once here, not by the model at
        # every step (its check is a host sync)
        self.mask = None if bool(attn.bool().all()) else attn
        # visibility of the in-place caches: the real columns (None when all are: no mask, flash kernels)
        self.padding = None if cfg.cache is None or self.mask is None else attn.bool().clone()
        self.columns = torch.zeros(bl, dtype=torch.long, device=canvas.device)  # head columns of full forwards
        self.window_columns = torch.arange(bl, device=canvas.device)  # head columns of cached steps
        self.full: KVCache | None = None  # the canvas-wide cache, as the full forward writes it
        self.past: KVCache | None = None  # the same tensors, as the current block's cached steps write them
        self.lo = -1
        self.pool = graph_pool(canvas.device, cfg.speed.cuda_graphs)  # one memory pool for the cached steps' graphs
        self.steps: dict[int, GraphedStep] = {}  # window width -> its cached step
        self.write: dict[int, torch.Tensor] = {}  # window width -> its write columns

    def release(self) -> None:
        """Drop the canvas-wide cache and the captured graphs (and their memory pool)."""
        self.full = self.past = None
        self.steps.clear()
        self.write.clear()

    def _cached_forward(self, window: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(window, position_ids=pos, past_key_values=self.past, logit_columns=self.window_columns)
        logits: torch.Tensor = out.logits
        return logits

    def __call__(self, start: int, end: int, step: int) -> torch.Tensor:
        m, c = self.model, self.canvas
        lo = start - self.shift
        if self.cfg.cache is None or step == 0 or self.past is None:  # a full forward: head on the block
            self.columns.copy_(raw_columns(start, end, self.shift, c.device))
        if self.cfg.cache is None:
            no_cache: torch.Tensor = m(c, attention_mask=self.mask, position_ids=self.pos,
                                       logit_columns=self.columns).logits
            return no_cache
        hi = c.shape[1] if self.cfg.cache == "prefix" else end
        if step == 0 or self.past is None:
            if self.full is None:  # the first block allocates the canvas-wide cache
                out = m(c, attention_mask=self.mask, position_ids=self.pos, use_cache=True, logit_columns=self.columns)
                cache = out.past_key_values
                self.full = KVCache(cache.keys, cache.values, self.padding,
                                    write_columns=torch.arange(c.shape[1], device=c.device))
                logits: torch.Tensor = out.logits
            else:  # later blocks rewrite it in place: the same full forward, no new cache
                logits = m(c, position_ids=self.pos, past_key_values=self.full, logit_columns=self.columns).logits
            if self.lo != lo:
                write = self.write.setdefault(hi - lo, torch.empty(hi - lo, dtype=torch.long, device=c.device))
                torch.arange(lo, hi, out=write)
                self.past = KVCache(self.full.keys, self.full.values, self.padding, write_columns=write)
                self.lo = lo
            return logits
        if hi - lo not in self.steps:
            self.steps[hi - lo] = GraphedStep(self._cached_forward, pool=self.pool, enabled=self.cfg.speed.cuda_graphs)
        window: torch.Tensor = self.steps[hi - lo](c[:, lo:hi], self.pos[:, lo:hi])
        return window


def _quota(cfg: SamplingConfig, still: torch.Tensor, step: int, spb: int, quota: list[int]) -> torch.Tensor:
    """[B] tokens to commit this step (LLaDA linear quota or Dream's 1 - s/t schedule)."""
    left = still.sum(-1)
    if cfg.threshold is not None:
        return torch.ones_like(left)
    if step >= spb - 1:
        if cfg.remasking in LLADA_REMASKING and step < len(quota):
            return torch.full_like(left, quota[step])
        return left
    if cfg.remasking in LLADA_REMASKING:
        return torch.full_like(left, quota[step])
    # a 0-dim CPU tensor enters a CUDA op as a scalar: no host-to-device copy (a sync)
    return (left.float() * _dream_ratio(step, spb)).long()


def _dream_ratio(step: int, spb: int) -> torch.Tensor:
    """1 - s/t on Dream's grid linspace(1, eps, spb + 1) at `step`, in float32 as in Dream."""
    ts = torch.linspace(1.0, DREAM_EPS, spb + 1)
    return 1 - ts[step + 1] / ts[step]


@torch.no_grad()
def decode_masked(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
                  cfg: SamplingConfig, ref_model: Any = None, *, init_response: torch.Tensor | None = None,
                  first_step: int = 0, last_step: int | None = None) -> RolloutBatch:
    """Decode a left-padded batch block by block (docs/generation.md#llada, #fast-dllm, #dream).

    Only still-masked positions of the current block compete; committed tokens are never revised.
    With `commit_block_start` (Dream's cached block decoder, DARE's Dream rollouts) the first step of
    a block commits its first position and the 1 - s/t schedule takes the other steps.
    Rows without masks in the block take no step (no forward result used, no random draw).

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompts and their real-token mask.
        seeds: [B] one seed per row.
        ref_model: optional second model scored on the same canvases (`ref_step_logp`).
        init_response, first_step, last_step: resume from a response canvas [B, R] at global
            step `first_step` and stop before `last_step` (tree rollouts; quota mode with
            steps_per_block <= block_length, where every block takes exactly steps_per_block steps).
    """
    traits = model.traits
    device = prompt_ids.device
    b, p = prompt_ids.shape
    r, bl = cfg.max_new_tokens, cfg.block_length
    mask_id = traits.mask_token_id
    response0 = torch.full((b, r), mask_id, device=device) if init_response is None else init_response
    canvas = torch.cat([prompt_ids, response0.clone()], dim=1)
    attn = torch.cat([prompt_mask, torch.ones((b, r), dtype=torch.bool, device=device)], dim=1)
    pos = positions_from_mask(attn)
    noise = RowNoise(seeds, device)
    rec_noise = record_noise(noise)
    rec = Recorder(b, r, device, steps=cfg.record_steps, ref=ref_model is not None)
    rec.row_step += first_step
    block_logits = _BlockLogits(model, cfg, canvas, attn, pos)
    spb = cfg.steps_per_block
    quota = transfer_quota(bl, spb)
    t = cfg.temperature if cfg.temperature > 0 else 1.0
    try:
        for blk in range(first_step // spb, cfg.num_blocks):
            start, end = p + blk * bl, p + (blk + 1) * bl
            step = first_step - blk * spb if blk == first_step // spb else 0
            logits: torch.Tensor | None = None
            while last_step is None or blk * spb + step < last_step:
                still = canvas[:, start:end] == mask_id
                active = still.any(-1)
                if not bool(active.any()):
                    break
                # quota schedules fill a block in spb steps, threshold decoding in at most bl
                check_progress(step, spb + bl, start, end, logits)
                # step records predict the whole response: one forward, the block sliced from it
                step_logits = response_logits(model, canvas, attn, pos, p) if cfg.record_steps else None
                logits = block_logits(start, end, step) if step_logits is None else step_logits[:, start - p:end - p]
                # LLaDA's confidences read the raw logits; Dream's read softmax(filtered)
                x0, conf, logp = propose_scored(logits, remasking=cfg.remasking, temperature=cfg.temperature,
                                                top_k=cfg.top_k, top_p=cfg.top_p, noise=noise, active=active,
                                                mask_id=mask_id, fused=cfg.speed.fused_sampling)
                k = _quota(cfg, still, step, spb, quota)
                if cfg.commit_block_start and step == 0:  # Dream's cached block decoder: the block's first position
                    commit = still & (torch.arange(bl, device=device) == 0)
                elif cfg.remasking == "origin" and cfg.threshold is None:
                    reveal = float(_dream_ratio(step, spb)) if step < spb - 1 else 1.0
                    commit = still & (noise.uniform((bl,), active) < reveal)
                elif cfg.alg_temp and cfg.threshold is None:
                    commit = sample_positions(conf, still, k, cfg.alg_temp, noise, active)
                else:
                    commit = select(conf, still, k, cfg.threshold)
                commit &= active[:, None]
                ref_logp = None
                if ref_model is not None:
                    ref = block_forward(ref_model, canvas, start, end, shift=int(ref_model.traits.logit_shift),
                                        attention_mask=attn, position_ids=pos).logits.float()
                    ref_logp = torch.log_softmax(ref / t, dim=-1).gather(-1, x0[..., None]).squeeze(-1)
                before = canvas[:, p:].clone() if cfg.record_steps else canvas[:, :0]
                prediction = None if step_logits is None else full_prediction(
                    step_logits, before, x0, start - p, cfg=cfg, noise=rec_noise, active=active, mask_id=mask_id)
                canvas[:, start:end] = torch.where(commit, x0, canvas[:, start:end])
                rec.record(active, start - p, commit, x0, logp, conf, before, ref_logp, prediction)
                step += 1
    finally:
        block_logits.release()  # on an exception too (see `_BlockLogits`: the cache would wait for the gc)
    zeros = torch.zeros(b, dtype=torch.long, device=device)
    return decoded_batch(prompt_ids, prompt_mask, canvas[:, p:], zeros, seeds, cfg, rec,
                         mask_id=mask_id, stop_ids=traits.stop_ids)

