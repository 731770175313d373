"""The one rollout batch type every sampler and engine returns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from dataclasses import dataclass, field, fields

import torch

from dllm_rollout.config import SamplingConfig
from dllm_rollout.prompts import left_pad
from dllm_rollout.record import Recorder
from dllm_rollout.record_schema import RECORD_FIELDS, RECORD_VERSION


@dataclass
class RolloutBatch:
    """The rollout record: prompts and generated responses, with optional trajectory records.

    Every decoder and engine adapter returns one; its fields are listed in
    `dllm_rollout.RECORD_FIELDS`, and `dllm_rollout.record_fields_filled` says which of them each
    backend fills. `filled_fields()` lists those present; `save_rollout` / `load_rollout` store it.

    Attributes:
        prompt_ids: [B, P] left-padded prompt ids.
        prompt_mask: [B, P] bool, True on real prompt tokens.
        response_ids: [B, R] generated tokens (prompt excluded).
        response_mask: [B, R] bool, True on response tokens that count (see `eos_handling`).
        seeds: [B] per-sample seeds; `generate(..., seed=seeds[i:i+1])` on prompt i replays it.
        unmask_step: [B, R] long, global denoising step at which each response token was
            committed (-1 if never), present when trajectories are recorded.
        step_logp: [B, R] float32 log-prob of each committed token under softmax(logits / T)
            (T = 1 at temperature 0; before top-k/top-p filtering) on the canvas of the step it
            was committed at, present when trajectories are recorded.
        ref_step_logp: [B, R] the same log-prob under a second (reference) model run on the same
            canvases (`generate(..., ref_model=...)`).
        step_canvas: [B, S, R] long, the response canvas before each of the sample's own steps
            (S = most steps any row took; rows that took fewer are padded with the mask id).
        step_x0: [B, S, R] long, the clean prediction at each step, committed tokens kept; masked
            diffusion: a token sampled at every masked position (the full prediction,
            `dllm_rollout.prediction`); block diffusion: proposals inside the block being decoded.
        step_confidence: [B, S, R] float32; masked diffusion: softmax(filter(logits / T)) at each
            position's sampled token; block diffusion: the sampler's confidence inside the block
            being decoded (NaN elsewhere).
        forwards: [B] long, the policy's denoising forwards spent on each sample (the steps it took;
            a tree leaf: the steps on its path); native decoders fill it, engines that report no
            steps leave it None.
        config: the SamplingConfig that produced the batch (None for engine outputs without one).
        extras: further per-sample tensors (block diffusion with trajectories: `tail_ids`,
            `tail_unmask_step` [B, T], the decoded rest of the terminal block after the response,
            padded with the mask id / -1, needed to replay the last block exactly; with token
            editing: `num_edits` [B] long, the row's token-to-token edits. An edited token records
            the step of its last write and the log-prob of the token kept, so rows with edits
            cannot be replayed step by step from `unmask_step`).
        version: `RECORD_VERSION` of the layout the batch follows.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    seeds: torch.Tensor
    unmask_step: torch.Tensor | None = None
    step_logp: torch.Tensor | None = None
    ref_step_logp: torch.Tensor | None = None
    step_canvas: torch.Tensor | None = None
    step_x0: torch.Tensor | None = None
    step_confidence: torch.Tensor | None = None
    forwards: torch.Tensor | None = None
    config: SamplingConfig | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    version: int = RECORD_VERSION

    def __post_init__(self) -> None:
        b = self.prompt_ids.shape[0]
        for name in ("prompt_mask", "response_ids", "response_mask", "seeds"):
            if getattr(self, name).shape[0] != b:
                raise ValueError(f"RolloutBatch.{name} has batch {getattr(self, name).shape[0]}, expected {b}")
        if self.forwards is not None and tuple(self.forwards.shape) != (b,):
            raise ValueError(f"RolloutBatch.forwards has shape {tuple(self.forwards.shape)}, expected ({b},)")

    def filled_fields(self) -> frozenset[str]:
        """The names of `dllm_rollout.RECORD_FIELDS` this batch holds (a field that is not None, or an
        `extras` key)."""
        out = {name for name, f in RECORD_FIELDS.items() if not f.in_extras and getattr(self, name) is not None}
        return frozenset(out | {name for name in self.extras if name in RECORD_FIELDS})

    @property
    def batch_size(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def input_ids(self) -> torch.Tensor:
        """[B, P + R] prompt followed by response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, P + R] bool: real prompt tokens and counted response tokens."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def select(self, index: torch.Tensor) -> RolloutBatch:
        """The rows at `index` (a long or bool tensor over the batch)."""
        kwargs: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                kwargs[f.name] = value[index]
            elif f.name == "extras":
                kwargs[f.name] = {k: v[index] for k, v in value.items()}
            else:
                kwargs[f.name] = value
        return type(self)(**kwargs)  # type: ignore[arg-type]


def stop_positions(response: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """[B, R] bool: True where the response holds one of `stop_ids` (the model's
    `DiffusionTraits.stop_ids`: its EOS and any further stop ids).

    Raises:
        ValueError: `stop_ids` is empty.
    """
    if not stop_ids:
        raise ValueError("stop_ids is empty: pass the model's traits.stop_ids (at least its EOS id)")
    hits = response == int(stop_ids[0])  # scalar comparisons: no id tensor copied to the device per call
    for t in stop_ids[1:]:
        hits |= response == int(t)
    return hits


def response_mask(response: torch.Tensor, stop_ids: Sequence[int], eos_handling: str) -> torch.Tensor:
    """[B, R] bool: all True ("keep"), or True through the first stop id ("truncate")."""
    if eos_handling == "keep":
        return torch.ones_like(response, dtype=torch.bool)
    is_stop = stop_positions(response, stop_ids).long()
    before = is_stop.cumsum(-1) - is_stop
    return before == 0


RECORDS = ("unmask_step", "step_logp", "ref_step_logp", "step_canvas", "step_x0", "step_confidence", "forwards")
"""The optional records of a RolloutBatch that are dataclass fields, by name."""


def rollout_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response: torch.Tensor,
    seeds: torch.Tensor,
    cfg: SamplingConfig,
    *,
    stop_ids: Sequence[int],
    counted: torch.Tensor | None = None,
    records: Mapping[str, torch.Tensor] | None = None,
    extras: dict[str, torch.Tensor] | None = None,
) -> RolloutBatch:
    """The one assembly of a RolloutBatch, for decoders and engines alike.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompts; seeds: [B].
        response: [B, R] response ids (R = `cfg.max_new_tokens`).
        cfg: the settings that produced the batch.
        stop_ids: the ids that end a response (`DiffusionTraits.stop_ids`).
        counted: [B, R] bool, the response mask when the caller's rule differs from
            `cfg.eos_handling` (engines); None: `response_mask(response, stop_ids, cfg.eos_handling)`.
        records: optional records by field name (a subset of `RECORDS`), each [B], [B, R] or [B, S, R].
        extras: further per-sample tensors (`RolloutBatch.extras`).
    """
    found: dict[str, Any] = dict(records or {})
    unknown = sorted(set(found) - set(RECORDS))
    if unknown:
        raise ValueError(f"records {unknown} are not RolloutBatch records; valid: {list(RECORDS)}")
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response,
        response_mask=response_mask(response, stop_ids, cfg.eos_handling) if counted is None else counted,
        seeds=seeds,
        config=cfg,
        extras={} if extras is None else extras,
        **found,
    )


def decoded_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    region: torch.Tensor,
    offsets: torch.Tensor,
    seeds: torch.Tensor,
    cfg: SamplingConfig,
    rec: Recorder,
    *,
    mask_id: int,
    stop_ids: Sequence[int],
    extras: dict[str, torch.Tensor] | None = None,
) -> RolloutBatch:
    """The batch a decoder returns: each row's response cut from its decoded region, with records.

    Args:
        prompt_ids, prompt_mask: [B, P] left-padded prompts; seeds: [B].
        region: [B, W] the decoded canvas after the prompt columns (W >= `cfg.max_new_tokens`).
        offsets: [B] long, the column of `region` where row b's response starts.
        rec: the decoder's trajectory records over `region`.
        mask_id: the model's mask id; stop_ids: the ids that end a response (`DiffusionTraits.stop_ids`).
        extras: further per-sample tensors (`RolloutBatch.extras`).

    Returns:
        RolloutBatch with `response_ids` [B, R] (R = `cfg.max_new_tokens`) and `forwards` [B];
        `unmask_step` and `step_logp` only when `cfg.record_trajectory`.
    """
    r = cfg.max_new_tokens
    idx = offsets[:, None] + torch.arange(r, device=region.device)[None]
    recs = rec.take(offsets, r, mask_id)
    if not cfg.record_trajectory:
        recs = {k: v for k, v in recs.items() if k not in ("unmask_step", "step_logp")}
    recs["forwards"] = rec.forwards.clone()
    return rollout_batch(prompt_ids, prompt_mask, region.gather(1, idx), seeds, cfg, stop_ids=stop_ids,
                         records=recs, extras=extras)


def batch_from_token_lists(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    seeds: torch.Tensor,
    cfg: SamplingConfig,
    *,
    stop_ids: Sequence[int],
    pad_id: int,
    unmask_steps: Sequence[Sequence[int]] | None = None,
) -> RolloutBatch:
    """An engine's token lists as a batch: prompts left-padded, responses right-padded with `pad_id`.

    Engines stop at a stop id, so the response mask always counts the returned tokens through the
    first stop id (docs/generation.md#rollout-output), whatever `cfg.eos_handling` says.

    Args:
        prompts, responses: B lists of token ids (responses longer than R = `cfg.max_new_tokens`
            are cut).
        seeds: [B] the seeds the engine was given.
        stop_ids: the ids that end a response (`DiffusionTraits.stop_ids`); pad_id: the padding id.
        unmask_steps: optional 0-based step per response token (engine step maps), -1 after the end.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} engine outputs")
    ids, mask = left_pad(prompts, pad_id)
    r = cfg.max_new_tokens
    resp = torch.full((len(responses), r), pad_id, dtype=torch.long)
    filled = torch.zeros((len(responses), r), dtype=torch.bool)
    steps = torch.full((len(responses), r), -1, dtype=torch.long)
    for i, toks in enumerate(responses):
        n = min(len(toks), r)
        resp[i, :n] = torch.as_tensor(list(toks)[:n], dtype=torch.long)
        filled[i, :n] = True
        if unmask_steps is not None:
            steps[i, :n] = torch.as_tensor(list(unmask_steps[i])[:n], dtype=torch.long)
    records = {"unmask_step": steps} if unmask_steps is not None else None
    return rollout_batch(ids, mask, resp, seeds, cfg, stop_ids=stop_ids,
                         counted=response_mask(resp, stop_ids, "truncate") & filled, records=records)


def _pad_to(t: torch.Tensor, dim: int, size: int, fill: float | int | bool, *, left: bool = False) -> torch.Tensor:
    extra = size - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    pad = torch.full(shape, fill, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=dim)


def concat_batches(batches: list[RolloutBatch], *, pad_id: int, mask_id: int) -> RolloutBatch:
    """Rows of several batches decoded with the same config, as one batch.

    Prompts are left-padded again to the widest (`pad_id`, mask False); step records are padded
    at the end of the step axis as rows that took fewer steps are (canvases and predictions
    with `mask_id`, confidences with NaN); `tail_ids` / `tail_unmask_step` with `mask_id` / -1.
    """
    if len(batches) == 1:
        return batches[0]
    out: dict[str, object] = {}
    fills = {"step_canvas": mask_id, "step_x0": mask_id, "step_confidence": float("nan")}
    for f in fields(RolloutBatch):
        values = [getattr(b, f.name) for b in batches]
        if f.name == "extras":
            keys = values[0].keys()
            extra_fill = {"tail_ids": mask_id, "tail_unmask_step": -1}
            merged = {}
            for k in keys:
                parts = [v[k] for v in values]
                if parts[0].dim() > 1:
                    width = max(p.shape[1] for p in parts)
                    parts = [_pad_to(p, 1, width, extra_fill.get(k, 0)) for p in parts]
                merged[k] = torch.cat(parts)
            out[f.name] = merged
        elif f.name in ("config", "version"):
            out[f.name] = values[0]
        elif values[0] is None:
            out[f.name] = None
        elif f.name in ("prompt_ids", "prompt_mask"):
            width = max(v.shape[1] for v in values)
            fill = pad_id if f.name == "prompt_ids" else False
            out[f.name] = torch.cat([_pad_to(v, 1, width, fill, left=True) for v in values])
        elif f.name in fills:
            width = max(v.shape[1] for v in values)
            out[f.name] = torch.cat([_pad_to(v, 1, width, fills[f.name]) for v in values])
        else:
            out[f.name] = torch.cat(values)
    return type(batches[0])(**out)  # type: ignore[arg-type]
