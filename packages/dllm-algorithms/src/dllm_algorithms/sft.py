"""Supervised fine-tuning of diffusion LMs: MDLM (LLaDA, Dream) and BDLM (SDAR, LLaDA2), full or LoRA.

The same NELBO for every family (LLaDA, arXiv 2502.09992, section 2.3; per block with one t per
sample for BD3LM, arXiv 2503.09573): the `Scorer` runs masked LMs directly and block LMs in the
BD3LM layout. `SFT` is an `OfflineObjective` (its masks and its loss) that
`dllm_train.OfflineWorker` trains; its loss settings are those of the phase's `SFTConfig`
(docs/algorithms.md#sft), and LoRA is a model transform applied before the worker is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from dllm_objectives import MaskPlan, iid_masks, mdm_sft_loss
from dllm_train import (
    OfflineInputs,
    OfflineObjective,
    OfflineWorker,
    OptimConfig,
    Scorer,
    SFTConfig,
    ValuesScorer,
    derive_seed,
    plan_token_logp,
)

from dllm_algorithms.families import ALL_FAMILIES
from dllm_algorithms.scoring import Metrics

SFTBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""(input_ids [B, L], attention_mask [B, L], response_valid [B, L])."""


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
class SFT(OfflineObjective[SFTBatch, MaskPlan]):
    """Diffusion SFT: NELBO on masked response tokens (LLaDA arXiv 2502.09992; BD3LM per block).

    `t_range` (0.3, 0.8) and `sft.weight_by_t=False` reproduce LLaDA2; `sft.normalizer="answer_len"`
    SDAR; "masked" LLaDA/Dream (docs/algorithms.md#sft). `lora` set: adapters only (LoRA SFT).

    Attributes:
        t_range: (t_min, t_max) the masking ratio t is drawn from (floored at `sft.eps`).
        lora: LoRA adapters to train instead of the weights (None: full fine-tuning).
        sft: the SFT phase's settings, the one home of the loss settings (`normalizer`,
            `weight_by_t`, `eps`); a run passes its `sft` section.
    """

    t_range: tuple[float, float] = (0.0, 1.0)
    lora: LoRA | None = None
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(weight_by_t=True))
    families: ClassVar[tuple[str, ...]] = ALL_FAMILIES
    row_local = True  # the NELBO is a sum of per-row terms
    noise_stream = "sft-mask"

    def __post_init__(self) -> None:
        if not 0.0 <= self.t_range[0] < self.t_range[1] <= 1.0:
            raise ValueError(f"algorithm.t_range must satisfy 0 <= t_min < t_max <= 1, got {self.t_range}")

    @property
    def normalizer(self) -> str:
        """The loss's normaliser (`sft.normalizer`; see `dllm_objectives.mdm_sft_loss`)."""
        return self.sft.normalizer

    @property
    def weight_by_t(self) -> bool:
        """Whether each masked token is weighted by 1/t (`sft.weight_by_t`)."""
        return self.sft.weight_by_t

    @property
    def eps(self) -> float:
        """The smallest masking ratio t (`sft.eps`)."""
        return self.sft.eps

    def prepare(self, batch: SFTBatch, generator: torch.Generator) -> MaskPlan:
        """One mask per sequence on its response, t ~ U(t_range) floored at eps."""
        return iid_masks(batch[2], 1, t_min=self.t_range[0], t_max=self.t_range[1], eps=self.eps,
                         generator=generator)

    def values(self, scorer: ValuesScorer, batch: SFTBatch, data: MaskPlan) -> torch.Tensor:
        """[B, L] log-probs of the clean tokens given the noised sequence."""
        ids, attn, _ = batch
        return plan_token_logp(scorer, ids, attn, data)[:, 0]

    def loss(self, values: torch.Tensor, inputs: OfflineInputs[SFTBatch, MaskPlan]) -> tuple[torch.Tensor, Metrics]:
        plan = inputs.data
        return mdm_sft_loss(values, plan.mask[:, 0], plan.meta["t"][:, 0], normalizer=self.normalizer,
                            response_mask=inputs.batch[2], weight_by_t=self.weight_by_t), {}

    def worker(self, model: Any, batches: Callable[[int], SFTBatch], optim: OptimConfig, *, steps: int, seed: int,
               attention: str | None = None, max_tokens_per_pass: int = 0) -> OfflineWorker[SFTBatch, MaskPlan]:
        """The worker that trains this objective (adapters injected into `model` first when `lora` is set and
        `model` has none yet).

        Args:
            batches: step -> batch, deterministic in step.
            steps: the phase's number of steps (the horizon of a cosine schedule).
            attention: packed attention backend of its passes (None: the padded batch).
            max_tokens_per_pass: token budget of one forward (0: the whole batch at once).
        """
        from dllm_models import has_adapters

        if self.lora is not None and not has_adapters(model):  # (`dare` applies the run's adapters itself)
            model = self.lora.apply(model, seed=seed)
        return OfflineWorker(model, self, batches, optim, seed=seed, steps=steps,
                             scorer=Scorer(model, attention=attention), max_tokens_per_pass=max_tokens_per_pass)


__all__ = ["LoRA", "SFT", "SFTBatch"]
