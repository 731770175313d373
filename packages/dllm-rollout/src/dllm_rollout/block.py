"""Block-diffusion decoding (SDAR, LLaDA2) on the global block grid, with an exact KV cache.

Blocks are aligned to absolute position 0 (block id = position // block_length, prompt
included), as in SDAR's `block_diffusion_generate`, LLaDA2's HF `generate` and SGLang
(docs/generation.md#sdar, #llada2). A prompt ending mid-block shares its last block with the first
response tokens.

Batch layout: row b is left-padded by a whole number of blocks so that every row's last complete
prompt block ends at the same column and columns and positions share the block grid. The decode
region then starts at that column; row b's response begins `prompt_len_b % block_length`
columns into it.

With the model's block-causal mask, a finished block never attends to later blocks, so its keys
and values are final once it is finished: caching them (`cache="prefix"`) is exact and equals
recomputing every finished block at every step (`cache=None`, LLaDA2's HF generate) up to
floating-point rounding. After a block is finished its final K/V take one more forward over it
(the "store" pass that SDAR's reference and lmdeploy perform). Here that forward is folded into
the next block's first step: one forward over [finished block ; next block], block-causal per
query, writes the finished block's final K/V and gives the next block's logits (the head runs on
the next block only). The finished block's queries see exactly what a store pass sees, so the
function is the same; it saves one forward per block, its weight and cache reads and its head.
`SamplingConfig.speed.fold_store=False` runs separate store passes.

Rows that have finished (`stop_at_eos`: a finished block of theirs holds a stop id) take no more steps,
and once `speed.retire_rows` of them have gathered they leave the batch: the canvas, the noise streams,
the records and the KV cache keep the live rows only (the cache packed in place), and the cached
steps are captured anew at the smaller batch, so later forwards, their weights' work and their
head run on the rows still denoising (as an engine with continuous batching drops finished
sequences). Every row's draws and records depend on that row alone (`RowNoise`, `Recorder`), so
a row decodes the same in the smaller batch, up to the rounding of a GEMM at another batch size.
Per-step records (`record_steps`) keep every row. `speed.retire_rows=0` keeps finished rows in the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from dllm_rollout.batch import RolloutBatch, decoded_batch, stop_positions
from dllm_rollout.config import SamplingConfig, SpeedConfig
from dllm_rollout.editing import EDITS, rows_to_step, step_edits, still_open
from dllm_rollout.graphs import GraphedStep, graph_pool
from dllm_rollout.head import block_forward
from dllm_rollout.static_cache import StaticBlockCache
from dllm_rollout.masked import transfer_quota
from dllm_rollout.noise import RowNoise
from dllm_rollout.progress import check_progress
from dllm_rollout.record import Recorder
from dllm_rollout.sampling import propose_scored, select, select_above



def grid_layout(prompt_lengths: torch.Tensor, block_length: int, max_new_tokens: int) -> tuple[int, int, torch.Tensor]:
    """Where each row sits on the shared block grid.

    Args:
        prompt_lengths: [B] real prompt lengths.

    Returns:
        full: number of complete prompt blocks of the longest such row (N); the decode region
        starts at column N * block_length. decode_blocks: blocks in the decode region (D).
        pad: [B] left padding of each row (a multiple of block_length).
    """
    n = prompt_lengths // block_length
    tail = prompt_lengths % block_length
    full = int(n.max().item())
    decode_blocks = int(((tail + max_new_tokens + block_length - 1) // block_length).max().item())
    return full, decode_blocks, (full - n) * block_length


def grid_canvas(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, block_length: int, max_new_tokens: int,
                mask_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Canvas [B, C] (pads, prompt, masks), its attention mask, positions, region start and offsets.

    Returns:
        canvas, attn, pos: [B, C]; region_start: first column of the decode region;
        offsets: [B] column of each row's first response token, relative to region_start.
    """
    b = prompt_ids.shape[0]
    device = prompt_ids.device
    lengths = prompt_mask.long().sum(-1)
    full, blocks, pad = grid_layout(lengths, block_length, max_new_tokens)
    width = (full + blocks) * block_length
    col = torch.arange(width, device=device)[None].expand(b, -1)
    pos = col - pad[:, None]
    attn = pos >= 0
    is_prompt = attn & (pos < lengths[:, None])
    canvas = torch.full((b, width), mask_id, dtype=torch.long, device=device)
    canvas[~attn] = pad_id
    # left-padded prompt token j of row b (j < len) sits at column pad_b + j
    src = prompt_ids.shape[1] - lengths[:, None] + pos.clamp(min=0)
    canvas[is_prompt] = prompt_ids.gather(1, src.clamp(max=prompt_ids.shape[1] - 1))[is_prompt]
    return canvas, attn, pos.clamp(min=0), full * block_length, lengths % block_length


@torch.no_grad()
def decode_blocks(model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: torch.Tensor,
                  cfg: SamplingConfig, ref_model: Any = None) -> RolloutBatch:
    """Block-by-block denoising with static or dynamic (threshold) unmasking.

    Each step forwards the current block only (against the KV cache of finished blocks) or, with
    `cache=None`, everything up to the end of the current block. Quota per step is
    block_length // steps (+1 for the first block_length % steps steps), restricted to masks;
    with `threshold` every mask with confidence >= threshold is committed, or the quota if fewer
    pass. `remasking="low_confidence_dynamic"` is DARE's threshold rule instead: every mask whose
    probability under softmax(logits / T) (before top-k / top-p) is strictly above `threshold`, and
    at least the quota (docs/generation.md#threshold-rule). Its number of commits per step is known
    only on the device, so it runs the step loop (each forward a CUDA graph of fixed shape), never
    the whole-step chain, which needs a known number of steps per block. A row stops after a block
    whose response part contains a stop id (`stop_at_eos`; the model's `traits.stop_ids`: its EOS
    and, for SDAR chat models, `<|im_end|>`).

    With `editing_threshold` (LLaDA2.1 joint-threshold decoding, docs/generation.md#llada2;
    `editing.py`) each step also overwrites filled, non-prompt tokens of the block whose proposal
    changed with confidence > editing_threshold, and a row leaves the block after a step that starts without masks and
    edits nothing, or after `max_post_steps` steps past its last mask; at most
    block_length + max_post_steps steps per block. Only the current block changes, so the KV
    cache of finished blocks stays exact. Unlike LLaDA2.1's HF `generate`, which adds its 0/1
    block mask to the attention scores (so earlier blocks still see later ones), the models here
    use a boolean block-causal mask: the additive-mask quirk is not reproduced.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompts; seeds: [B].
        ref_model: optional second block-diffusion model scored on the same canvases.

    Returns:
        RolloutBatch; with editing, `extras["num_edits"]` [B] counts each row's token edits.
    """
    traits = model.traits
    if traits.logit_shift:
        raise ValueError("block diffusion with logit_shift=1 is not supported (no family needs it)")
    bl, r = cfg.block_length, cfg.max_new_tokens
    mask_id, eos_id, stop_ids = traits.mask_token_id, traits.eos_token_id, traits.stop_ids
    device = prompt_ids.device
    canvas, attn, pos, r0, offsets = grid_canvas(prompt_ids, prompt_mask, bl, r, mask_id, traits.pad_token_id)
    b, width = canvas.shape
    noise = RowNoise(seeds, device)
    rec = Recorder(b, width - r0, device, steps=cfg.record_steps, ref=ref_model is not None)
    quota = transfer_quota(bl, cfg.steps)
    t = cfg.temperature if cfg.temperature > 0 else 1.0
    live = torch.ones(b, dtype=torch.bool, device=device)
    num_edits = torch.zeros(b, dtype=torch.long, device=device)
    # the batch's rows still in the working tensors below (all, until finished rows retire)
    # finished rows leave the batch once `speed.retire_rows` have gathered (0: never); each retirement
    # captures the cached steps anew, so a few rows are not worth one
    retire = cfg.speed.retire_rows
    full = (_FullRows(canvas, rec, offsets, num_edits) if cfg.stop_at_eos and retire > 0 and not cfg.record_steps
            else None)
    post_budget = cfg.max_post_steps if cfg.editing_threshold is not None else 0
    own = _own_span(offsets, r, bl)
    cached = _CachedBlocks(model, canvas, attn, pos, r0, bl, cfg.speed) if cfg.cache == "prefix" else None
    try:
        for start in range(r0, width, bl):
            end = start + bl
            step, post, open_rows = 0, torch.zeros_like(num_edits), live.clone()
            logits: torch.Tensor | None = None
            while True:
                still = (canvas[:, start:end] == mask_id) & open_rows[:, None]
                active, post = rows_to_step(open_rows, still.any(-1), post, post_budget)
                if not bool(active.any()):
                    break
                # the quota fills a block in cfg.steps steps, threshold decoding in at most bl; then the
                # post-fill budget (editing)
                check_progress(step, max(cfg.steps, bl) + post_budget + 1, start, end, logits)
                if cached is not None:
                    logits = cached.logits(start, end)
                else:
                    logits = _recompute_logits(model, canvas, attn, pos, start, end)
                x0, conf, logp = propose_scored(logits, remasking=_confidence_of(cfg), temperature=cfg.temperature,
                                                top_k=cfg.top_k, top_p=cfg.top_p, noise=noise, active=active,
                                                mask_id=mask_id, fused=cfg.speed.fused_sampling)
                k = torch.full((canvas.shape[0],), quota_at(quota, step, bl), dtype=torch.long, device=device)
                commit = _commit(cfg, conf, still, k) & active[:, None]
                edits = step_edits(x0, conf, canvas[:, start:end], active, mask_id=mask_id, lo=start - r0,
                                   span=own, editing_threshold=cfg.editing_threshold)
                ref_logp = None
                if ref_model is not None:
                    ref = _recompute_logits(ref_model, canvas, attn, pos, start, end).float()
                    ref_logp = torch.log_softmax(ref / t, dim=-1).gather(-1, x0[..., None]).squeeze(-1)
                before = canvas[:, r0:].clone() if cfg.record_steps else canvas[:, :0]
                canvas[:, start:end] = torch.where(commit | edits, x0, canvas[:, start:end])
                rec.record(active, start - r0, commit | edits, x0, logp, conf, before, ref_logp)
                num_edits += edits.sum(-1)
                open_rows = still_open(active, still.any(-1), edits)
                step += 1
            if cached is not None and end < width:
                cached.finish(start, end)
            if cfg.stop_at_eos:
                region = canvas[:, r0:end]
                col = torch.arange(end - r0, device=device)[None]
                live &= ~(stop_positions(region, stop_ids) & (col >= offsets[:, None])).any(-1)
                alive = int(live.sum())
                if alive == 0:
                    break
                if full is not None and end < width and live.numel() - alive >= retire:
                    keep = live.nonzero().flatten()
                    full.put(canvas, rec, num_edits)
                    full.rows = full.rows[keep]
                    canvas, attn, pos, offsets = canvas[keep], attn[keep], pos[keep], offsets[keep]
                    live, num_edits, noise, rec = live[keep], num_edits[keep], noise.rows(keep), rec.rows(keep)
                    own = _own_span(offsets, r, bl)
                    if cached is not None:
                        cached.keep_rows(keep, canvas, attn, pos)
    finally:
        # on an exception too: the graphs hold bound methods of this object, a cycle that would keep the
        # canvas-wide KV cache alive until the next garbage collection (a retry would meet it on the GPU)
        if cached is not None:
            cached.release()
    if full is not None and full.rows.numel() < full.canvas.shape[0]:
        full.put(canvas, rec, num_edits)
        canvas, rec, offsets, num_edits = full.canvas, full.rec, full.offsets, full.num_edits
    region = canvas[:, r0:]
    region = torch.where(region == mask_id, torch.full_like(region, eos_id), region)
    return decoded_batch(prompt_ids, prompt_mask, region, offsets, seeds, cfg, rec, mask_id=mask_id, stop_ids=stop_ids,
                         extras=_tail_extras(region, offsets, cfg, rec, mask_id, num_edits))


def _confidence_of(cfg: SamplingConfig) -> str:
    """The confidence a block step ranks masks by: "maskgit_plus" (the proposal's probability under
    the filtered, tempered softmax) or, for DARE's threshold rule, "low_confidence_dynamic" (under
    softmax(logits / T) before top-k / top-p)."""
    return "low_confidence_dynamic" if cfg.remasking == "low_confidence_dynamic" else "maskgit_plus"


def _commit(cfg: SamplingConfig, conf: torch.Tensor, still: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, bl] masks a step commits: DARE's threshold rule (above the threshold, at least the quota)
    or the quota plus every mask >= threshold (`select`)."""
    if cfg.remasking == "low_confidence_dynamic":
        assert cfg.threshold is not None  # SamplingConfig checks it
        return select_above(conf, still, k, cfg.threshold)
    return select(conf, still, k, cfg.threshold)


def quota_at(quota: list[int], step: int, block: int) -> int:
    """Masks a row may commit at `step` of a block: the per-step quota, then the whole block."""
    return quota[step] if step < len(quota) else block


def _own_span(offsets: torch.Tensor, max_new_tokens: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's region columns [first, end): its response and the rest of its terminal block."""
    return offsets, (offsets + max_new_tokens + block - 1) // block * block


class _FullRows:
    """The whole batch's canvas, records and edit counts while finished rows retire from the
    working batch; `rows` [n] are the batch rows the working tensors hold, in order."""

    def __init__(self, canvas: torch.Tensor, rec: Recorder, offsets: torch.Tensor, num_edits: torch.Tensor) -> None:
        self.canvas, self.rec, self.offsets, self.num_edits = canvas, rec, offsets, num_edits
        self.rows = torch.arange(canvas.shape[0], device=canvas.device)

    def put(self, canvas: torch.Tensor, rec: Recorder, num_edits: torch.Tensor) -> None:
        """Write the working rows back (a no-op while they are the whole batch's own tensors)."""
        if canvas is self.canvas:
            return
        self.canvas[self.rows] = canvas
        self.rec.put(self.rows, rec)
        self.num_edits[self.rows] = num_edits


def _recompute_logits(model: Any, canvas: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, start: int,
                      end: int) -> torch.Tensor:
    """[B, bl, V] logits of block [start, end) by recomputing [0, end) (head on the block only)."""
    out = block_forward(model, canvas[:, :end], start, end, attention_mask=attn[:, :end], position_ids=pos[:, :end])
    logits: torch.Tensor = out.logits
    return logits


class _CachedBlocks:
    """Block steps against an exact KV cache of the finished blocks (`cache="prefix"`).

    The cache is a `StaticBlockCache` over the canvas into which every step writes its block's
    keys/values in place, so every step has the same shapes and runs as one CUDA graph
    (`GraphedStep`). Decode-region columns are always real tokens (rows are padded by whole blocks
    before the region), so a step passes no attention mask of its own; padding lives in the
    cache's key padding. With `speed.fold_store` a finished block's store pass is the first half of the
    next block's first step (module doc), a second graph of 2 x block columns.
    """

    def __init__(self, model: Any, canvas: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, r0: int,
                 block: int, speed: SpeedConfig) -> None:
        self.model, self.canvas, self.attn, self.pos, self.block = model, canvas, attn, pos, block
        self.speed = speed
        self.static: StaticBlockCache | None = None
        self.shown = -1  # start column of the block the cache currently writes
        self.pending = -1  # start column of a finished block whose store pass is still to run
        self.step: GraphedStep | None = None
        self.pair_step: GraphedStep | None = None
        self._capture_steps()
        self.head = torch.arange(block, 2 * block, device=canvas.device)  # the next block's columns
        if r0 > 0:
            # prompt blocks: keys/values only, the head runs on no column
            out = block_forward(model, canvas[:, :r0], 0, 0, attention_mask=attn[:, :r0],
                                position_ids=pos[:, :r0], use_cache=True)
            self.static = StaticBlockCache(out.past_key_values, canvas.shape[0], canvas.shape[1], block)
            self.static.store(0, out.past_key_values, attn[:, :r0])

    def release(self) -> None:
        """Drop the cache and the graphs now: a step holds a bound method of this object, a
        reference cycle that would keep the cache alive until the next garbage collection."""
        self.static, self.step, self.pair_step = None, None, None

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert self.static is not None
        logits: torch.Tensor = self.model(ids, position_ids=pos, past_key_values=self.static.cache).logits
        return logits

    def _pair_forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """[finished block ; next block]: writes both blocks' keys/values, logits of the next one."""
        assert self.static is not None
        logits: torch.Tensor = self.model(ids, position_ids=pos, past_key_values=self.static.pair,
                                          logit_columns=self.head).logits
        return logits

    def setup(self, start: int, end: int) -> int:
        """Make the cache serve a forward of block [start, end) (the cache must exist). Returns the
        start of the finished block whose store pass that forward must fold in (the two-block
        forward, `pair`), or -1 for a forward of the block alone."""
        assert self.static is not None
        if self.pending >= 0:
            prev, self.pending = self.pending, -1
            self.static.show_pair(prev, start, end, self.attn[:, prev:end])
            self.shown = start
            return prev
        if self.shown != start:
            self.static.show(start, end, self.attn[:, start:end])
            self.shown = start
        return -1

    def _run(self, start: int, end: int, *, keep: bool = False) -> tuple[torch.Tensor, Any]:
        """Logits of block [start, end); with `keep` and no cache yet also the block's own KVCache."""
        ids, pos = self.canvas[:, start:end], self.pos[:, start:end]
        if self.static is None:  # no finished block yet: nothing to attend to but the block
            out = self.model(ids, attention_mask=self.attn[:, start:end], position_ids=pos, use_cache=keep)
            return out.logits, out.past_key_values
        prev = self.setup(start, end)
        if prev >= 0:  # the folded store pass of [prev, start) and the first step of [start, end)
            assert self.pair_step is not None, "released"
            pair: torch.Tensor = self.pair_step(self.canvas[:, prev:end], self.pos[:, prev:end])
            return pair, None
        assert self.step is not None, "released"
        logits: torch.Tensor = self.step(ids, pos)
        return logits, None

    def logits(self, start: int, end: int) -> torch.Tensor:
        """[B, bl, V] logits of block [start, end) (a graph buffer: read before the next call)."""
        return self._run(start, end)[0]

    def keep_rows(self, rows: torch.Tensor, canvas: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor) -> None:
        """Go on with batch rows `rows` only (finished rows retired), on their `canvas`, `attn` and
        `pos`: the cache keeps their rows, and the steps are captured anew at the new batch size."""
        self.canvas, self.attn, self.pos = canvas, attn, pos
        if self.static is not None:
            self.static.keep_rows(rows)
        self.step = self.pair_step = None  # the old graphs and their memory go before new ones are captured
        self._capture_steps()

    def _capture_steps(self) -> None:
        """New block and two-block steps (captured at their first call), sharing one memory pool: the
        graphs run one after another."""
        graphs = self.speed.cuda_graphs
        self.pool = graph_pool(self.canvas.device, graphs)
        self.step = GraphedStep(self._forward, pool=self.pool, enabled=graphs)
        self.pair_step = GraphedStep(self._pair_forward, pool=self.pool, enabled=graphs)

    def finish(self, start: int, end: int) -> None:
        """Block [start, end) is finished: cache its final keys/values (SDAR's "store" pass), now or,
        with `speed.fold_store`, as part of the next block's first step."""
        if self.pending >= 0:  # the block after a pending store took no step: store that one alone
            prev, self.pending = self.pending, -1
            self._run(prev, prev + self.block)
        if self.speed.fold_store and self.static is not None:
            self.pending = start
            return
        _, kv = self._run(start, end, keep=True)
        if self.static is None:
            self.static = StaticBlockCache(kv, self.canvas.shape[0], self.canvas.shape[1], self.block)
            self.static.store(start, kv, self.attn[:, start:end])


def _tail_extras(region: torch.Tensor, offsets: torch.Tensor, cfg: SamplingConfig, rec: Recorder,
                 mask_id: int, num_edits: torch.Tensor) -> dict[str, torch.Tensor]:
    """`num_edits` with editing; with trajectories the terminal block's rest after the response."""
    r = cfg.max_new_tokens
    extras: dict[str, torch.Tensor] = {}
    if cfg.editing_threshold is not None:
        extras[EDITS] = num_edits
    if cfg.record_trajectory:
        tail_w = region.shape[1] - r - int(offsets.min().item())
        tcol = torch.arange(tail_w, device=region.device)[None] + offsets[:, None] + r
        inside = tcol < region.shape[1]
        tcol = tcol.clamp(max=region.shape[1] - 1)
        extras["tail_ids"] = torch.where(inside, region.gather(1, tcol), mask_id)
        extras["tail_unmask_step"] = torch.where(inside, rec.unmask_step.gather(1, tcol), -1)
    return extras
