"""Masked-diffusion SFT: a step function over (prompt, response) batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dllm_objectives import iid_masks, mdm_sft_loss
from dllm_train.config import OptimConfig, SFTConfig
from dllm_train.likelihood import noised_token_logp
from dllm_train.seeding import generator
from dllm_train.workers import build_optimizer

SFTBatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
"""step -> (input_ids [B, L], attention_mask [B, L], response_valid [B, L]), deterministic in step."""


class SFTWorker:
    """Trains the masked-diffusion NELBO on response tokens (LLaDA SFT, arXiv 2502.09992 §2.3)."""

    def __init__(self, model: Any, batches: SFTBatchFn, sft: SFTConfig, optim: OptimConfig, *, seed: int) -> None:
        self.model = model
        self.batches = batches
        self.sft = sft
        self.optim_cfg = optim
        self.optimizer = build_optimizer(model, optim)
        self.seed = seed

    def step(self, step: int) -> dict[str, float]:
        ids, attn, response = self.batches(step)
        plan = iid_masks(response, 1, eps=self.sft.eps, generator=generator(self.seed, "sft-mask", step))
        self.model.train()
        logp = noised_token_logp(self.model, ids, attn, plan)[:, 0]
        t = plan.meta["t"][:, 0]
        loss = mdm_sft_loss(logp, plan.mask[:, 0], t, normalizer=self.sft.normalizer,
                            response_mask=response, weight_by_t=self.sft.weight_by_t)
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        warm = self.optim_cfg.warmup_steps
        for group in self.optimizer.param_groups:
            group["lr"] = self.optim_cfg.lr * (min(1.0, (step + 1) / warm) if warm else 1.0)
        if torch.isfinite(norm) and torch.isfinite(loss):
            self.optimizer.step()
        return {"loss": float(loss.detach()), "grad_norm": float(norm)}

    def state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
