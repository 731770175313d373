"""Sampling configuration, validated before any model call."""

from __future__ import annotations

from dataclasses import dataclass

REMASKING = ("low_confidence", "random")
CACHES = (None, "prefix", "dual")
EOS_HANDLING = ("keep", "truncate")


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How to decode a batch.

    Attributes:
        max_new_tokens: response length R (the canvas of masks appended to each prompt).
        steps: total denoising steps over the whole response.
        block_length: semi-autoregressive block size; must divide max_new_tokens.
        temperature: 0 takes the argmax; > 0 samples from softmax(logits / temperature).
        remasking: "low_confidence" commits the most confident proposals, "random" random ones.
        cache: None, "prefix" or "dual" (masked diffusion KV caches).
        threshold: if set, commit every proposal with confidence >= threshold (at least one).
        eos_handling: "keep" counts every response token (reference LLaDA/Dream rollouts);
            "truncate" counts tokens through the first EOS only.
        record_trajectory: record the step at which each token was committed and its log-prob.
    """

    max_new_tokens: int
    steps: int
    block_length: int
    temperature: float = 0.0
    remasking: str = "low_confidence"
    cache: str | None = None
    threshold: float | None = None
    eos_handling: str = "keep"
    record_trajectory: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.block_length < 1 or self.max_new_tokens % self.block_length:
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
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking {self.remasking!r} unknown; choose one of {REMASKING}")
        if self.cache not in CACHES:
            raise ValueError(f"cache {self.cache!r} unknown; choose one of {CACHES}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1] or None, got {self.threshold}")
        if self.eos_handling not in EOS_HANDLING:
            raise ValueError(f"eos_handling {self.eos_handling!r} unknown; choose one of {EOS_HANDLING}")

    @property
    def num_blocks(self) -> int:
        return self.max_new_tokens // self.block_length

    @property
    def steps_per_block(self) -> int:
        return max(1, self.steps // self.num_blocks)
