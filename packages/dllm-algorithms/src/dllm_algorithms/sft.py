"""Supervised fine-tuning of diffusion LMs: MDLM (LLaDA, Dream) and BDLM (SDAR, LLaDA2), full or LoRA.

The same NELBO for every family (the Scorer picks the BD3LM layout for block models); the
per-family reference settings (docs/algorithms.md#sft) are data here, and LoRA is a model transform applied
before the worker is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from dllm_train import OptimConfig, SFTConfig, SFTWorker, derive_seed
from dllm_train.sft import SFTBatchFn

from dllm_algorithms.families import ALL_FAMILIES


@dataclass(frozen=True)
class LoRA:
    """LoRA adapters (Hu et al., arXiv 2106.09685) through `dllm_models.apply_lora`."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0:
            raise ValueError(f"lora.rank must be >= 1 and lora.alpha > 0, got {self.rank}, {self.alpha}")

    def apply(self, model: Any, *, seed: int = 0) -> Any:
        """Inject the adapters; their random initial weights are drawn from `seed` (global RNG untouched)."""
        from dllm_models import apply_lora

        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(derive_seed(seed, "lora-init"))
            return apply_lora(model, rank=self.rank, alpha=self.alpha, dropout=self.dropout)


@dataclass(frozen=True)
class SFT:
    """Diffusion SFT: NELBO on masked response tokens (LLaDA arXiv 2502.09992; BD3LM per block).

    `t_range` (0.3, 0.8) and `weight_by_t=False` reproduce LLaDA2; `normalizer="answer_len"`
    SDAR; "masked" LLaDA/Dream (docs/algorithms.md#sft). `lora` set: adapters only (LoRA SFT).

    Attributes:
        normalizer: "masked", "response" or "answer_len" (`dllm_objectives.mdm_sft_loss`).
        weight_by_t: weight each masked token by 1/t (the NELBO).
        eps: smallest masking ratio t.
        t_range: (t_min, t_max) the masking ratio t is drawn from.
        lora: LoRA adapters to train instead of the weights (None: full fine-tuning).
    """

    normalizer: str = "masked"
    weight_by_t: bool = True
    eps: float = 1e-3
    t_range: tuple[float, float] = (0.0, 1.0)
    lora: LoRA | None = None
    families: ClassVar[tuple[str, ...]] = ALL_FAMILIES

    def config(self, *, steps: int, batch_size: int) -> SFTConfig:
        return SFTConfig(steps=steps, batch_size=batch_size, eps=self.eps, normalizer=self.normalizer,
                         weight_by_t=self.weight_by_t)

    def worker(self, model: Any, batches: SFTBatchFn, optim: OptimConfig, *, steps: int, batch_size: int,
               seed: int, attention: str | None = None, max_tokens_per_pass: int = 0) -> SFTWorker:
        """The SFT worker (adapters injected first when `lora` is set).

        Args:
            attention: packed attention backend of its passes (None: the padded batch).
            max_tokens_per_pass: token budget of one forward (0: the whole batch at once).
        """
        from dllm_train import Scorer

        if self.lora is not None:
            model = self.lora.apply(model, seed=seed)
        return SFTWorker(model, batches, self.config(steps=steps, batch_size=batch_size), optim, seed=seed,
                         t_range=self.t_range, scorer=Scorer(model, attention=attention),
                         max_tokens_per_pass=max_tokens_per_pass)
