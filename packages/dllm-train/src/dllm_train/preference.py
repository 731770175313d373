"""Preference training of diffusion LMs: DPO on Monte-Carlo ELBOs of chosen/rejected responses.

DPO (Rafailov et al., arXiv 2305.18290) needs log-likelihoods that a diffusion LM only bounds;
the ELBO replaces them (docs/algorithms.md#dpo). Variance-reduced variants (LLaDA 1.5, arXiv 2505.19223) use a
larger budget, one mask per timestep (stratified counts) and the same masks for policy and
reference (antithetic sampling); the choice of sampler and sharing is data of the
`PreferenceObjective`, the worker is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dllm_objectives import MaskPlan, dpo_logits, dpo_loss, elbo
from dllm_train.metrics import device_peak
from dllm_train.config import OptimConfig
from dllm_train.likelihood import Scorer, plan_token_logp
from dllm_train.optim import OptimizerStep
from dllm_train.passes import ValuesFn, accumulate, evaluate
from dllm_train.seeding import generator


@dataclass(frozen=True)
class PreferenceBatch:
    """Chosen and rejected sequences of the same prompts, each [B, S] (prompt + response).

    Attributes:
        chosen_ids, chosen_attention, chosen_response: ids, real tokens, response positions.
        rejected_ids, rejected_attention, rejected_response: the same for the rejected side.
    """

    chosen_ids: torch.Tensor
    chosen_attention: torch.Tensor
    chosen_response: torch.Tensor
    rejected_ids: torch.Tensor
    rejected_attention: torch.Tensor
    rejected_response: torch.Tensor


@dataclass(frozen=True)
class PreferenceObjective:
    """How a preference algorithm estimates likelihoods and scores pairs.

    Attributes:
        name: registry key (logs only).
        sample_plan: (response_valid [B, S], num_samples, generator) -> MaskPlan.
        num_samples: Monte-Carlo masks per response.
        beta: DPO temperature.
        share_masks: reuse the policy's masks for the reference (antithetic sampling).
        normalize_by_width: divide ELBOs by the padded width (the reference's `÷ R` parity).
    """

    name: str
    sample_plan: Callable[[torch.Tensor, int, torch.Generator], MaskPlan]
    num_samples: int = 1
    beta: float = 0.1
    share_masks: bool = True
    normalize_by_width: bool = False

    def __post_init__(self) -> None:
        if self.num_samples < 1 or self.beta <= 0:
            raise ValueError(f"{self.name}: need num_samples >= 1 and beta > 0, got {self.num_samples}, {self.beta}")


PreferenceBatchFn = Callable[[int], PreferenceBatch]


class PreferenceWorker:
    """Policy + frozen reference; one DPO step per call.

    Args:
        model: trainable policy.
        ref_model: frozen reference (the initial policy).
        batches: step -> PreferenceBatch.
        objective: the preference algorithm.
        optim: optimizer settings.
        seed: root seed of the masks.
        steps: the phase's number of steps (the horizon of a cosine schedule without decay_steps).
        attention: packed attention backend of the policy and reference passes (None: padded).
        max_tokens_per_pass: token budget of one forward (0: each side's rows at once); the
            gradient equals the single-batch one (`dllm_train.passes`).
    """

    def __init__(self, model: Any, ref_model: Any, batches: PreferenceBatchFn, objective: PreferenceObjective,
                 optim: OptimConfig, *, seed: int, steps: int = 0, attention: str | None = None,
                 max_tokens_per_pass: int = 0) -> None:
        self.model = model
        self.steps = steps
        self.ref_model = ref_model.eval()
        for p in self.ref_model.parameters():
            p.requires_grad_(False)
        self.batches = batches
        self.objective = objective
        self.optim = OptimizerStep(model, optim, horizon=steps)
        self.optimizer = self.optim.optimizer
        self.scorer = Scorer(model, attention=attention)
        self.ref_scorer = Scorer(self.ref_model, attention=attention)
        self.max_tokens = max_tokens_per_pass
        self.seed = seed

    def _elbo(self, scorer: Any, ids: torch.Tensor, attn: torch.Tensor, plan: MaskPlan) -> torch.Tensor:
        lp = plan_token_logp(scorer, ids, attn, plan)
        norm = "padded" if self.objective.normalize_by_width else None
        return elbo(lp, plan, normalizer=norm).mean(-1)

    def _pieces(self, step: int) -> tuple[ValuesFn, ValuesFn]:
        """(policy values, reference values): scorer -> [2, B] chosen and rejected ELBOs."""
        obj = self.objective
        b = self.batches(step)
        gen = generator(self.seed, "preference-mask", step)
        plans = [obj.sample_plan(b.chosen_response, obj.num_samples, gen),
                 obj.sample_plan(b.rejected_response, obj.num_samples, gen)]
        ref_plans = plans if obj.share_masks else [
            obj.sample_plan(b.chosen_response, obj.num_samples, gen),
            obj.sample_plan(b.rejected_response, obj.num_samples, gen)]
        sides = [(b.chosen_ids, b.chosen_attention), (b.rejected_ids, b.rejected_attention)]

        def policy(scorer: Any) -> torch.Tensor:
            return torch.stack([self._elbo(scorer, i, a, p) for (i, a), p in zip(sides, plans)])

        def reference(scorer: Any) -> torch.Tensor:
            return torch.stack([self._elbo(scorer, i, a, p) for (i, a), p in zip(sides, ref_plans)])
        return policy, reference

    def values(self, step: int) -> tuple[torch.Tensor, ...]:
        """(policy chosen, policy rejected, ref chosen, ref rejected) ELBOs [B] of step `step`."""
        policy, reference = self._pieces(step)
        ref = evaluate(reference, self.ref_scorer, self.max_tokens)[0]
        pol = policy(self.scorer)
        return pol[0], pol[1], ref[0], ref[1]

    def step(self, step: int) -> dict[str, float]:
        self.model.train()
        policy, reference = self._pieces(step)
        ref = evaluate(reference, self.ref_scorer, self.max_tokens)[0]
        beta = self.objective.beta

        def loss_fn(v: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return dpo_loss(v[0], v[1], ref[0], ref[1], beta=beta), {}

        self.optim.zero_grad()
        # the DPO margin couples a pair's two sides: values first, then passes backpropagating dL/dv
        result = accumulate(policy, loss_fn, self.scorer, max_tokens=self.max_tokens, row_local=False)
        loss, pol = float(result.loss), result.values
        stepped = self.optim.step(loss)
        logits = dpo_logits(pol[0], pol[1], ref[0], ref[1], beta=beta)
        return {"loss": loss, **{k: v for k, v in stepped.items() if k != "lr"},
                "reward_margin": float(logits.mean()), "pair_accuracy": float((logits > 0).float().mean()), **device_peak()}

    def state(self) -> dict[str, Any]:
        return self.optim.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.optim.load_state(state)
