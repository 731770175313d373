"""Workers: rollout, reward, actor and reference, each a plain object around one job.

The same classes run in-process (local mode) and inside Ray actors (ray mode), so the update a
user debugs locally is the update that runs distributed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from dllm_rollout import RolloutBatch, SamplingConfig, decode, left_pad
from dllm_train.config import OptimConfig
from dllm_train.dataflow import Experience
from dllm_train.likelihood import noised_token_logp
from dllm_train.objective import PolicyObjective

logger = logging.getLogger(__name__)


def sequence_inputs(rollout: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, prompt_valid, response_valid), all [B, P + R]."""
    zeros_p = torch.zeros_like(rollout.prompt_mask)
    zeros_r = torch.zeros_like(rollout.response_mask)
    prompt_valid = torch.cat([rollout.prompt_mask, zeros_r], dim=1)
    response_valid = torch.cat([zeros_p, rollout.response_mask], dim=1)
    return rollout.input_ids, rollout.attention_mask, prompt_valid, response_valid


class RolloutWorker:
    """Generates responses with the current policy weights."""

    def __init__(self, model: Any, sampling: SamplingConfig) -> None:
        self.model = model
        self.sampling = sampling

    def generate(self, prompts: Sequence[Sequence[int]], seeds: torch.Tensor) -> RolloutBatch:
        """Decode `prompts` with one seed per sample (the seeds make every sample replayable)."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompts, self.model.traits.pad_token_id, device)
        batch = decode(self.model, ids, mask, seeds, self.sampling)
        self.model.train(was_training)
        return batch

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Weight hand-off from the actor (a no-op when both share one module)."""
        self.model.load_state_dict(state, strict=False)


class RewardWorker:
    """Scores decoded responses with a verifiable reward."""

    def __init__(self, reward_fn: Callable[[str, str], float], detokenize: Callable[[list[int]], str]) -> None:
        self.reward_fn = reward_fn
        self.detokenize = detokenize

    def score(self, rollout: RolloutBatch, answers: Sequence[str]) -> tuple[torch.Tensor, list[str]]:
        """Rewards [B] and the decoded texts of the counted response tokens."""
        texts = []
        for ids, keep in zip(rollout.response_ids.tolist(), rollout.response_mask.tolist()):
            texts.append(self.detokenize([t for t, k in zip(ids, keep) if k]))
        scores = torch.tensor([self.reward_fn(t, a) for t, a in zip(texts, answers)], dtype=torch.float32)
        return scores, texts


class ReferenceWorker:
    """A frozen copy of the initial policy, for KL terms."""

    def __init__(self, model: Any) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def log_probs(self, exp: Experience, objective: PolicyObjective) -> torch.Tensor:
        assert exp.plan is not None
        ids, attn, _, _ = sequence_inputs(exp.rollout)
        return objective.reduce(noised_token_logp(self.model, ids, attn, exp.plan), exp.plan, exp.rollout)


def build_optimizer(model: Any, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


class ActorWorker:
    """Holds the trainable policy and its optimizer; computes old log-probs and updates."""

    def __init__(self, model: Any, objective: PolicyObjective, optim: OptimConfig) -> None:
        self.model = model
        self.objective = objective
        self.optim_cfg = optim
        self.optimizer = build_optimizer(model, optim)
        self.updates = 0
        self.skipped = 0

    def _response_logp(self, exp: Experience) -> torch.Tensor:
        assert exp.plan is not None
        ids, attn, _, _ = sequence_inputs(exp.rollout)
        return self.objective.reduce(noised_token_logp(self.model, ids, attn, exp.plan), exp.plan, exp.rollout)

    def prepare(self, exp: Experience, generator: torch.Generator) -> None:
        """Sample the shared mask plan and the old-policy log-probs (no gradient)."""
        exp.plan = self.objective.sample_plan(exp.rollout, generator)
        with torch.no_grad():
            exp.old_logp = self._response_logp(exp)

    def _lr_scale(self) -> float:
        warm = self.optim_cfg.warmup_steps
        return min(1.0, (self.updates + 1) / warm) if warm else 1.0

    def update(self, exp: Experience) -> dict[str, float]:
        """One optimizer step; a non-finite loss or gradient skips it and leaves state untouched."""
        assert exp.old_logp is not None and exp.advantages is not None
        self.model.train()
        logp = self._response_logp(exp)
        loss, metrics = self.objective.loss(
            logp, exp.old_logp, exp.advantages, exp.rollout.response_mask, ref_logp=exp.ref_logp
        )
        self.optimizer.zero_grad(set_to_none=True)
        out = {k: float(v.detach()) for k, v in metrics.items()}
        out["loss"] = float(loss.detach())
        if not math.isfinite(out["loss"]):
            return self._skip(out, "loss")
        torch.autograd.backward(loss)
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        out["grad_norm"] = norm
        if not math.isfinite(norm):
            return self._skip(out, "gradient")
        for group in self.optimizer.param_groups:
            group["lr"] = self.optim_cfg.lr * self._lr_scale()
        self.optimizer.step()
        self.updates += 1
        out["skipped"] = 0.0
        return out

    def _skip(self, out: dict[str, float], what: str) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped += 1
        logger.warning("non-finite %s: step skipped, weights and optimizer state unchanged", what)
        out["skipped"] = 1.0
        return out

    def state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates, "skipped": self.skipped,
                "optim_cfg": asdict(self.optim_cfg)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.skipped = int(state["skipped"])
