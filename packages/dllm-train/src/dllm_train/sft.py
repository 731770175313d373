"""Masked- and block-diffusion SFT: a step function over (prompt, response) batches.

One code path for every family: the `Scorer` runs masked LMs (LLaDA, Dream) directly and block
LMs (SDAR, LLaDA2) in the BD3LM layout, so the same NELBO (LLaDA, arXiv 2502.09992, section 2.3;
docs/algorithms.md#sft; per block with one t per sample for BD3LM, arXiv 2503.09573) trains both.
LoRA SFT is the same worker on a model with adapters (`dllm_models.apply_lora`): only trainable
weights are optimised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dllm_objectives import iid_masks, mdm_sft_loss
from dllm_train.metrics import device_peak
from dllm_train.config import OptimConfig, SFTConfig
from dllm_train.likelihood import Scorer, plan_token_logp
from dllm_train.optim import OptimizerStep
from dllm_train.passes import LossFn, ValuesFn, accumulate
from dllm_train.seeding import generator

SFTBatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""step -> (input_ids [B, L], attention_mask [B, L], response_valid [B, L]), deterministic in step."""


class SFTWorker:
    """Trains the diffusion NELBO on response tokens.

    Args:
        model: any family module (adapters already injected for LoRA SFT).
        batches: step -> batch.
        sft: normaliser, t floor and 1/t weighting.
        optim: optimizer settings.
        seed: root seed of the masks.
        t_range: (t_min, t_max) of the masking ratio (LLaDA2 uses (0.3, 0.8)); default (0, 1)
            floored at `sft.eps`.
        scorer: how the model is run (default `Scorer(model)`, the padded path).
        max_tokens_per_pass: token budget of one forward (0: the whole batch at once); the
            gradient equals the single-batch one (`dllm_train.passes`).
    """

    def __init__(self, model: Any, batches: SFTBatchFn, sft: SFTConfig, optim: OptimConfig, *, seed: int,
                 t_range: tuple[float, float] = (0.0, 1.0), scorer: Scorer | None = None,
                 max_tokens_per_pass: int = 0) -> None:
        if not 0.0 <= t_range[0] < t_range[1] <= 1.0:
            raise ValueError(f"t_range must satisfy 0 <= t_min < t_max <= 1, got {t_range}")
        self.model = model
        self.batches = batches
        self.sft = sft
        self.optim = OptimizerStep(model, optim, horizon=sft.steps)
        self.optimizer = self.optim.optimizer
        self.scorer = scorer if scorer is not None else Scorer(model)
        self.max_tokens = max_tokens_per_pass
        self.seed = seed
        self.t_range = t_range

    def _pieces(self, step: int) -> tuple[ValuesFn, LossFn]:
        ids, attn, response = self.batches(step)
        plan = iid_masks(response, 1, t_min=self.t_range[0], t_max=self.t_range[1], eps=self.sft.eps,
                         generator=generator(self.seed, "sft-mask", step))
        t = plan.meta["t"][:, 0]

        def values(scorer: Any) -> torch.Tensor:
            return plan_token_logp(scorer, ids, attn, plan)[:, 0]

        def loss(logp: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return mdm_sft_loss(logp, plan.mask[:, 0], t, normalizer=self.sft.normalizer,
                                response_mask=response, weight_by_t=self.sft.weight_by_t), {}
        return values, loss

    def loss(self, step: int) -> torch.Tensor:
        """The SFT loss of step `step` (with gradient, one forward over the whole batch)."""
        values, loss = self._pieces(step)
        return loss(values(self.scorer))[0]

    def step(self, step: int) -> dict[str, float]:
        """One optimizer step on the batch of step `step`: loss, grad_norm, optimizer_steps, skipped."""
        self.model.train()
        self.optim.zero_grad()
        values, loss_fn = self._pieces(step)
        # the NELBO is a sum of per-row terms: each pass backpropagates its own rows
        loss = float(accumulate(values, loss_fn, self.scorer, max_tokens=self.max_tokens, row_local=True).loss)
        stepped = self.optim.step(loss)
        return {"loss": loss, **{k: v for k, v in stepped.items() if k != "lr"}, **device_peak()}

    def state(self) -> dict[str, Any]:
        return self.optim.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.optim.load_state(state)
