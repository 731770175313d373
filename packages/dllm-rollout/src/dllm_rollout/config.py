"""Sampling configuration, validated before any model call."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

LLADA_REMASKING = ("low_confidence", "random")
DREAM_REMASKING = ("origin", "maskgit_plus", "topk_margin", "entropy")
# block diffusion: "low_confidence" (quota, or Fast-dLLM's threshold) and DARE's threshold rule
BLOCK_REMASKING = ("low_confidence", "low_confidence_dynamic")
REMASKING = LLADA_REMASKING + DREAM_REMASKING + BLOCK_REMASKING[1:]
# Dream confidences ranked by top-k under the 1 - s/t schedule (what `commit_block_start` applies to)
DREAM_RANKED = ("maskgit_plus", "topk_margin", "entropy")
CACHES = (None, "prefix", "dual")
EOS_HANDLING = ("keep", "truncate")
ENGINES = ("native", "lmdeploy")


@dataclass(frozen=True, kw_only=True)
class SpeedConfig:
    """How the native decoder runs (never what it samples).

    Every switch leaves the samples unchanged, up to the rounding of a GEMM at another batch size
    (tests compare both settings).

    Attributes:
        cuda_graphs: cached decoding steps replay as CUDA graphs (`graphs.GraphedStep`; CUDA only).
            A step whose capture fails runs eagerly, with one logged warning per process, and
            is counted (`graphs.capture_failures`, the rollout metric `graph_capture_failures`).
        fold_store: block diffusion with `cache="prefix"`: a finished block's store forward is the
            first half of the next block's first step (`block.py`); False runs separate store passes.
        retire_rows: block diffusion with `stop_at_eos`: rows that stopped leave the batch once this
            many have gathered (0: never); 1.80x the tokens/s of keeping them (docs/benchmarks.md).
        fused_sampling: proposals, confidences and log-probs in one Triton kernel where it runs
            (`sampling.propose_scored`: CUDA, or CPU under TRITON_INTERPRET=1).
    """

    cuda_graphs: bool = True
    fold_store: bool = True
    retire_rows: int = 16
    fused_sampling: bool = True

    def __post_init__(self) -> None:
        if self.retire_rows < 0:
            raise ValueError(f"rollout.speed.retire_rows must be >= 0 (0: finished rows stay in the batch), "
                             f"got {self.retire_rows}")


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How to decode a batch.

    Masked diffusion (`block_diffusion=False`, LLaDA/Dream): the response is a canvas of
    `max_new_tokens` masks split into semi-autoregressive blocks of `block_length` counted from the
    response start; `steps` is the total number of denoising steps.

    Block diffusion (`block_diffusion=True`, SDAR/LLaDA2): blocks lie on the global grid
    (position // block_length, prompt included); `steps` is the number of denoising steps *per
    block* and `max_new_tokens` need not be a block multiple.

    Attributes:
        max_new_tokens: response length R.
        steps: total denoising steps (masked) or steps per block (block diffusion).
        block_length: block size; divides max_new_tokens for masked diffusion.
        temperature: 0 takes the argmax; > 0 samples from softmax(filtered logits / temperature).
        top_k: keep the k most likely tokens before sampling (None: all).
        top_p: keep the smallest set of tokens with mass >= top_p (None or 1.0: all).
        remasking: which proposals to commit. LLaDA: "low_confidence" (probability of the
            proposal at T=1), "random". Dream: "origin", "maskgit_plus", "topk_margin",
            "entropy" (docs/generation.md#dream; these use Dream's 1 - s/t schedule). Block diffusion:
            "low_confidence" (the quota, or with `threshold` the quota plus every mask >= threshold;
            confidence = probability under the filtered, tempered softmax) or
            "low_confidence_dynamic", the threshold rule of DARE's block-family rollouts (SGLang's
            `LowConfidence`, lmdeploy's `low_confidence_dynamic`, LLaDA2's `generate`;
            docs/generation.md#threshold-rule): each step commits every mask of the block whose
            confidence is strictly above `threshold`, and at least the step's quota of the most
            confident (one per step with `steps=block_length`); confidence = probability of the
            proposal under softmax(logits / T) before top-k / top-p (T=1 at temperature 0).
            Needs `threshold`.
        commit_block_start: Dream's cached block decoder (DARE's Dream rollouts, its
            `generation_utils_block.py`): the first step of each block commits the block's first
            position only (its proposal, whatever its confidence) and the 1 - s/t schedule runs on
            the block's other steps. Masked diffusion with a Dream confidence
            ("maskgit_plus", "topk_margin", "entropy") and no threshold.
        alg_temp: Dream position sampling: choose positions by sampling from
            softmax(confidence / alg_temp) without replacement instead of top-k (None/0: top-k).
        cache: masked diffusion: None, "prefix" or "dual" (Fast-dLLM; approximate). Block
            diffusion: None recomputes every finished block each step; "prefix" keeps an exact
            KV cache of finished blocks.
        threshold: parallel decoding. Masked: commit every masked proposal in the block with
            confidence >= threshold, and always the most confident one. Block diffusion
            (dynamic unmasking): commit those >= threshold, or the step's quota if fewer pass.
        eos_handling: "keep" counts every response token (reference LLaDA/Dream rollouts);
            "truncate" counts tokens through the first EOS only.
        stop_at_eos: block diffusion: a row stops after a block whose response part holds EOS
            (remaining positions are filled with EOS).
        block_aligned_budget: block diffusion: each row's response ends on the global block grid,
            max_new_tokens - (prompt_length + max_new_tokens) % block_length tokens (DARE's
            `align_cj_max_new_tokens`), so no length cut falls inside a block; the
            columns after it are not counted (`response_mask`) and carry no records.
        editing_threshold: block diffusion: LLaDA2.1 token editing (joint-threshold decoding,
            docs/generation.md#llada2). Each step also overwrites already-filled, non-prompt
            tokens of the current block whose new proposal differs with confidence >
            editing_threshold; a block ends when a step starts without masks and edits nothing. Needs `threshold` (the
            mask-to-token rule; `steps=block_length` gives LLaDA2.1's one-token minimum). None:
            no editing (tokens are never revised).
        max_post_steps: with editing, at most this many steps per block after its last mask was
            filled (LLaDA2.1's `max_post_steps`); ignored without editing.
        record_trajectory: record per token the step it was committed at and its log-prob.
        record_steps: record per step the canvas, the clean prediction and its confidences
            (masked diffusion: of the whole response at every step, `dllm_rollout.prediction`; needs
            cache=None).
        block_diffusion: masked (False) or block diffusion (True); the model decides it: `generate`
            sets it from `model.traits.block_length`.
        max_rows: decode at most this many rows at a time (0: the whole batch in one call), so
            decoding memory is bounded; exact, since every row has its own seed. The trainer's
            rollout worker reads it (`dllm_train.RolloutWorker`).
        engine: who decodes the trainer's rollouts: "native" (`generate`) or "lmdeploy" (its
            PyTorch engine, colocated, for block-diffusion models; `dllm_train.EngineRolloutWorker`).
        engine_kv_fraction: the share of free GPU memory the engine may take for its KV cache.
        speed: how the native decoder runs (`SpeedConfig`: CUDA graphs, folded store passes, row
            retirement, fused sampling); never what it samples.
    """

    max_new_tokens: int
    steps: int
    block_length: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    remasking: str = "low_confidence"
    commit_block_start: bool = False
    alg_temp: float | None = None
    cache: str | None = None
    threshold: float | None = None
    eos_handling: str = "keep"
    stop_at_eos: bool = True
    block_aligned_budget: bool = False
    editing_threshold: float | None = None
    max_post_steps: int = 16
    record_trajectory: bool = False
    record_steps: bool = False
    block_diffusion: bool = False
    max_rows: int = 0
    engine: str = "native"
    engine_kv_fraction: float = 0.3
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.speed, SpeedConfig):
            raise TypeError(f"rollout.speed must be a SpeedConfig, got {type(self.speed).__name__}; "
                            "build it with dllm_rollout.SpeedConfig(...)")
        if self.engine not in ENGINES:
            raise ValueError(f"rollout.engine={self.engine!r} unknown; choose one of {ENGINES}")
        if not 0.0 < self.engine_kv_fraction < 1.0:
            raise ValueError(f"rollout.engine_kv_fraction must be in (0, 1), got {self.engine_kv_fraction}")
        if self.max_rows < 0:
            raise ValueError(f"rollout.max_rows must be >= 0 (0: the whole batch at once), got {self.max_rows}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.block_length < 1:
            raise ValueError(f"block_length must be >= 1, got {self.block_length}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.block_diffusion:
            if self.max_new_tokens % self.block_length:
                raise ValueError(
                    f"block_length ({self.block_length}) must divide max_new_tokens "
                    f"({self.max_new_tokens}); e.g. block_length={self.max_new_tokens}"
                )
            if self.steps < self.num_blocks:
                raise ValueError(
                    f"steps ({self.steps}) must be >= the number of blocks ({self.num_blocks}) "
                    "so every block gets at least one step"
                )
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking {self.remasking!r} unknown; choose one of {REMASKING}")
        if self.block_diffusion and self.remasking not in BLOCK_REMASKING:
            raise ValueError(
                f"remasking {self.remasking!r} is not available for block diffusion; use "
                "'low_confidence' (static quota, optionally with threshold) or 'low_confidence_dynamic' "
                "with threshold (DARE's threshold rule)"
            )
        if self.remasking == "low_confidence_dynamic":
            self._check_dynamic()
        if self.commit_block_start:
            self._check_block_start()
        if self.alg_temp is not None and self.alg_temp < 0:
            raise ValueError(f"alg_temp must be >= 0 or None, got {self.alg_temp}")
        if self.cache not in CACHES:
            raise ValueError(f"cache {self.cache!r} unknown; choose one of {CACHES}")
        if self.block_diffusion and self.cache == "dual":
            raise ValueError(
                "cache='dual' is a masked-diffusion cache; block diffusion takes cache=None "
                "(recompute) or cache='prefix' (exact KV cache of finished blocks)"
            )
        if self.block_aligned_budget and not self.block_diffusion:
            raise ValueError(
                "block_aligned_budget=True is a block-diffusion setting (masked-diffusion responses are "
                "block-aligned already); set block_aligned_budget=False"
            )
        if self.block_aligned_budget and self.max_new_tokens < self.block_length:
            raise ValueError(
                f"block_aligned_budget=True needs max_new_tokens >= block_length so every prompt keeps a "
                f"positive budget; got max_new_tokens={self.max_new_tokens}, block_length={self.block_length}"
            )
        if self.record_steps and self.cache is not None and not self.block_diffusion:
            raise ValueError(
                f"record_steps=True with cache={self.cache!r}: masked-diffusion step records predict the "
                "whole response at every step (one full forward each), which no cache serves; set cache=None"
            )
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1] or None, got {self.threshold}")
        if self.eos_handling not in EOS_HANDLING:
            raise ValueError(f"eos_handling {self.eos_handling!r} unknown; choose one of {EOS_HANDLING}")
        if self.max_post_steps < 0:
            raise ValueError(f"max_post_steps must be >= 0, got {self.max_post_steps}")
        if self.editing_threshold is not None:
            self._check_editing(self.editing_threshold)

    def _check_dynamic(self) -> None:
        if not self.block_diffusion:
            raise ValueError(
                "remasking='low_confidence_dynamic' is the block-diffusion threshold rule (SDAR, LLaDA2); "
                "masked diffusion takes remasking='low_confidence' with threshold (Fast-dLLM)"
            )
        if self.threshold is None:
            raise ValueError(
                "remasking='low_confidence_dynamic' needs threshold (commit every mask above it); got "
                "threshold=None. DARE's block-family recipes use 0.9 (through lmdeploy) or 0.95"
            )
        if self.editing_threshold is not None:
            raise ValueError(
                f"editing_threshold={self.editing_threshold} (token editing) runs with remasking='low_confidence'; "
                "set remasking='low_confidence' or editing_threshold=None"
            )

    def _check_block_start(self) -> None:
        if self.block_diffusion or self.remasking not in DREAM_RANKED or self.threshold is not None:
            raise ValueError(
                f"commit_block_start=True (Dream's cached block decoder) needs masked diffusion with remasking in "
                f"{DREAM_RANKED} and threshold=None; got block_diffusion={self.block_diffusion}, "
                f"remasking={self.remasking!r}, threshold={self.threshold}: set commit_block_start=False"
            )

    def _check_editing(self, editing_threshold: float) -> None:
        if not 0.0 <= editing_threshold <= 1.0:
            raise ValueError(f"editing_threshold must be in [0, 1] or None, got {editing_threshold}")
        if not self.block_diffusion:
            raise ValueError(
                f"editing_threshold={editing_threshold} (token editing) is a block-diffusion decoder "
                "(LLaDA2.1); masked diffusion never revises tokens: set editing_threshold=None"
            )
        if self.threshold is None:
            raise ValueError(
                f"editing_threshold={editing_threshold} needs threshold, the mask-to-token rule of "
                "joint-threshold decoding; got threshold=None. LLaDA2.1's card suggests threshold=0.7 "
                "with editing_threshold=0.5 (quality) or 0.5 with 0.0 (speed)"
            )

    @property
    def deterministic(self) -> bool:
        """Whether decoding draws no randomness, so every row of a prompt decodes the same response:
        temperature 0 (argmax proposals) with confidence-ordered commits ("random" remasking, and
        Dream's "origin" or `alg_temp` position sampling without `threshold`, draw per-row noise)."""
        sampled_positions = self.threshold is None and (self.remasking == "origin" or bool(self.alg_temp))
        return self.temperature == 0 and self.remasking != "random" and not sampled_positions

    @property
    def num_blocks(self) -> int:
        """Masked diffusion: blocks in the response."""
        return self.max_new_tokens // self.block_length

    @property
    def steps_per_block(self) -> int:
        """Masked diffusion: steps // num_blocks (floor 1); block diffusion: steps."""
        if self.block_diffusion:
            return self.steps
        return max(1, self.steps // self.num_blocks)


def configure(base: SamplingConfig | None = None, /, **settings: Any) -> SamplingConfig:
    """`base` with `settings` replaced, or a new config of `settings` when `base` is None.

    Args:
        base: the settings to start from (None: only `settings`, which must then hold
            max_new_tokens, steps and block_length).
        settings: SamplingConfig fields by name (`speed` as a SpeedConfig or its dict form).

    Raises:
        TypeError: for a name that is not a SamplingConfig field (the error names it, its value and
            the closest field); ValueError: for a bad combination (`SamplingConfig.__post_init__`).
    """
    names = [f.name for f in dataclasses.fields(SamplingConfig)]
    for key, value in settings.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"the settings are {names}"
            raise TypeError(f"{key}={value!r} is not a decoding setting (a SamplingConfig field); {hint}")
    speed = settings.get("speed")
    if isinstance(speed, Mapping):  # the JSON form (`dataclasses.asdict` of a SamplingConfig)
        settings["speed"] = SpeedConfig(**speed)
    if base is None:
        return SamplingConfig(**settings)
    return dataclasses.replace(base, **settings) if settings else base


def on_model_grid(cfg: SamplingConfig, block_length: int | None, *, convert: bool = False) -> SamplingConfig:
    """`cfg` in the decoding mode of a model whose native block is `block_length` (None: masked diffusion).

    The one rule that sets `block_diffusion` and the block grid (`generate`, the trainer's rollouts,
    `dllm_eval`'s decoding resolver). A masked-diffusion model takes `cfg` as it is (`block_diffusion`
    False). A block-diffusion model decodes on its own grid (`block_diffusion` True): settings already
    written for it must have its block; with `convert`, settings written for masked models (an
    evaluation preset: `block_diffusion` False, total steps) move onto the grid: the model's block,
    steps per block at the settings' tokens per step (e.g. length / 2 steps: two tokens a step),
    the length rounded up to whole blocks, and the exact KV cache of finished blocks ("prefix") unless a
    cache is named.

    Raises:
        ValueError: a block model and a `cfg.block_length` other than its block that is not converted,
            naming both blocks and the fix.
    """
    if block_length is None:
        return dataclasses.replace(cfg, block_diffusion=False) if cfg.block_diffusion else cfg
    if cfg.block_diffusion or not convert:
        if cfg.block_length == block_length:
            return cfg if cfg.block_diffusion else dataclasses.replace(cfg, block_diffusion=True)
        raise ValueError(
            f"block_length={cfg.block_length} but the model decodes blocks of {block_length}: a block-diffusion "
            f"model's attention uses its own grid; set block_length={block_length} (or build the model with "
            f"block size {cfg.block_length})")
    per_block = max(1, round(block_length * cfg.steps / cfg.max_new_tokens))
    length = -(-cfg.max_new_tokens // block_length) * block_length
    return dataclasses.replace(cfg, max_new_tokens=length, block_length=block_length, steps=per_block,
                               cache=cfg.cache or "prefix", block_diffusion=True)
