"""Workers: rollout, reward, actor and reference, each a plain object around one job.

The same classes run in-process (local mode) and inside Ray actors (ray mode), so the update a
user debugs locally is the update that runs distributed. None of them knows which algorithm it
runs: everything algorithm-specific comes from the `PolicyObjective`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from dllm_rollout import RolloutBatch, SamplingConfig, decode, left_pad
from dllm_train.config import OptimConfig
from dllm_train.dataflow import Experience
from dllm_train.likelihood import Scorer
from dllm_train.lockstep import group_all
from dllm_train.objective import PolicyObjective, default_update
from dllm_train.schedule import learning_rate

logger = logging.getLogger(__name__)


def sequence_inputs(rollout: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, prompt_valid, response_valid), all [B, P + R]."""
    zeros_p = torch.zeros_like(rollout.prompt_mask)
    zeros_r = torch.zeros_like(rollout.response_mask)
    prompt_valid = torch.cat([rollout.prompt_mask, zeros_r], dim=1)
    response_valid = torch.cat([zeros_p, rollout.response_mask], dim=1)
    return rollout.input_ids, rollout.attention_mask, prompt_valid, response_valid


def sampling_for(model: Any, sampling: SamplingConfig, objective: PolicyObjective | None) -> SamplingConfig:
    """The run's SamplingConfig with the model's decoding mode and the objective's overrides."""
    block = model.traits.block_length
    fields: dict[str, Any] = {"block_diffusion": block is not None}
    if block is not None:
        fields["block_length"] = int(block)
    if objective is not None:
        fields.update(objective.sampling_overrides)
    return dataclasses.replace(sampling, **fields)


class RolloutWorker:
    """Generates responses with the current policy weights.

    Args:
        model: the policy module (shared with the actor in local mode).
        sampling: the run's decoding settings.
        objective: the algorithm; its `sampling_overrides` / `rollout` are applied.
        ref_model: a frozen reference model scored on the rollout canvases, for objectives
            with `needs_rollout_reference`.
    """

    def __init__(self, model: Any, sampling: SamplingConfig, *, objective: PolicyObjective | None = None,
                 ref_model: Any = None) -> None:
        self.model = model
        self.sampling = sampling_for(model, sampling, objective)
        self.objective = objective
        self.ref_model = ref_model
        if objective is not None and objective.needs_rollout_reference and ref_model is None:
            raise ValueError(f"algorithm {objective.name!r} scores rollouts with a reference model; "
                             "pass RolloutWorker(..., ref_model=<frozen copy of the initial policy>)")

    def generate(self, prompts: Sequence[Sequence[int]], seeds: torch.Tensor) -> RolloutBatch:
        """Decode `prompts` with one seed per sample (the seeds make every sample replayable)."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompts, self.model.traits.pad_token_id, device)
        custom = self.objective.rollout if self.objective is not None else None
        with torch.no_grad():
            if custom is not None:
                batch = custom(self.model, ids, mask, seeds, self.sampling, self.ref_model)
            else:
                batch = decode(self.model, ids, mask, seeds, self.sampling, self.ref_model)
        self.model.train(was_training)
        return batch

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Weight hand-off from the actor: a full state dict, or only LoRA adapter weights.

        A no-op when both share one module. Keys missing from `state` keep their values, so an
        adapter-only dict (`dllm_models.adapter_state_dict`) updates just the adapters.
        """
        own = self.model.state_dict()
        unknown = [k for k in state if k not in own]
        if unknown:
            raise ValueError(f"load_weights got {len(unknown)} keys the rollout model lacks, e.g. {unknown[:3]}")
        self.model.load_state_dict(state, strict=False)


class RewardWorker:
    """Scores decoded responses with a verifiable reward.

    When the rollout recorded per-step clean predictions (`step_x0`), their rewards are stored
    in `rollout.extras["step_scores"]` [B, S] (NaN past a row's last step) for objectives with
    step-wise advantages.
    """

    def __init__(self, reward_fn: Callable[[str, str], float], detokenize: Callable[[list[int]], str]) -> None:
        self.reward_fn = reward_fn
        self.detokenize = detokenize

    def _text(self, ids: list[int], keep: list[bool]) -> str:
        return self.detokenize([t for t, k in zip(ids, keep) if k])

    def score(self, rollout: RolloutBatch, answers: Sequence[str]) -> tuple[torch.Tensor, list[str]]:
        """Rewards [B] and the decoded texts of the counted response tokens."""
        if len(answers) != rollout.batch_size:
            raise ValueError(f"got {len(answers)} answers for a rollout of {rollout.batch_size} samples")
        texts = [self._text(ids, keep) for ids, keep in
                 zip(rollout.response_ids.tolist(), rollout.response_mask.tolist())]
        scores = torch.tensor([self.reward_fn(t, a) for t, a in zip(texts, answers)], dtype=torch.float32)
        if rollout.step_x0 is not None:
            rollout.extras["step_scores"] = self._step_scores(rollout, answers)
        return scores, texts

    def _step_scores(self, rollout: RolloutBatch, answers: Sequence[str]) -> torch.Tensor:
        assert rollout.step_x0 is not None and rollout.step_canvas is not None
        b, s, _ = rollout.step_x0.shape
        out = torch.full((b, s), float("nan"))
        for i in range(b):
            keep = rollout.response_mask[i].tolist()
            for k in range(s):
                # a step past the row's last one is padded with the all-mask canvas of step 0
                if k > 0 and bool((rollout.step_canvas[i, k] == rollout.step_canvas[i, 0]).all()):
                    continue
                out[i, k] = self.reward_fn(self._text(rollout.step_x0[i, k].tolist(), keep), answers[i])
        return out


class ReferenceWorker:
    """A frozen copy of the initial policy, for KL terms and reference likelihoods.

    Args:
        model: the frozen model.
        scorer: how it is run (default `Scorer(model)`; e.g. a `SequenceParallelScorer`).
    """

    def __init__(self, model: Any, *, scorer: Scorer | None = None) -> None:
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.scorer = scorer if scorer is not None else Scorer(self.model)

    @torch.no_grad()
    def log_probs(self, exp: Experience, objective: PolicyObjective) -> torch.Tensor:
        """The objective's values under the reference model (stacked over update iterations)."""
        return _per_iteration(objective, self.scorer, exp)


def _per_iteration(objective: PolicyObjective, scorer: Scorer, exp: Experience) -> torch.Tensor:
    if objective.num_iterations == 1:
        return objective.score(scorer, exp)
    values = []
    for i in range(objective.num_iterations):
        exp.iteration = i
        values.append(objective.score(scorer, exp))
    exp.iteration = 0
    return torch.stack(values)


def build_optimizer(model: Any, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (requires_grad=False everywhere)")
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)


class ActorWorker:
    """Holds the trainable policy and its optimizer; computes old values and updates.

    Args:
        model: the trainable policy.
        objective: the algorithm.
        optim: optimizer settings.
        scorer: how the policy is run for every old and training pass (default `Scorer(model)`;
            a `SequenceParallelScorer` splits each sequence over a group of ranks).
        reuse_old: skip the separate old pass when it is provably redundant: an objective with
            one update per batch and the default update reads its old values from the same
            weights, inputs and masks as its training forward, so the training forward's values
            (detached) are the old values (importance ratio exactly 1). Saves one forward pass
            over the batch per step.
    """

    def __init__(self, model: Any, objective: PolicyObjective, optim: OptimConfig, *,
                 scorer: Scorer | None = None, reuse_old: bool = True) -> None:
        if optim.schedule != "constant" and not optim.decay_steps:
            raise ValueError(f"optim.schedule={optim.schedule!r} in RL needs optim.decay_steps (e.g. trainer.max_steps): "
                             "the actor does not know the run's length")
        self.model = model
        self.objective = objective
        self.optim_cfg = optim
        self.optimizer = build_optimizer(model, optim)
        self.scorer = scorer if scorer is not None else Scorer(model)
        self.reuse_old = reuse_old
        self.updates = 0
        self.skipped = 0

    @property
    def old_from_training_pass(self) -> bool:
        """Whether old values come from the training forward (see `reuse_old`)."""
        obj = self.objective
        return self.reuse_old and obj.needs_old and obj.num_iterations == 1 and obj.update is None

    def prepare(self, exp: Experience, generator: torch.Generator) -> None:
        """Derive the objective's per-batch data, sample the shared plan, compute old values."""
        obj = self.objective
        exp.extras.update(updates=self.updates, mask_id=self.scorer.mask_id, eos_id=self.scorer.eos_id)
        if obj.prepare is not None:
            obj.prepare(exp, generator)
        if obj.sample_plan is not None:
            if obj.num_iterations == 1:
                exp.plan = obj.sample_plan(exp.rollout, generator)
            else:
                exp.plan = [obj.sample_plan(exp.rollout, generator) for _ in range(obj.num_iterations)]
        if self.old_from_training_pass:
            exp.extras["old_from_training_pass"] = True
        elif obj.needs_old:
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                exp.old_logp = _per_iteration(obj, self.scorer, exp)
            self.model.train(was_training)


    def update(self, exp: Experience) -> dict[str, float]:
        """One optimizer step per objective iteration; a non-finite loss or gradient skips it."""
        out: dict[str, float] = {}
        for i in range(self.objective.num_iterations):
            exp.iteration = i
            out = self._step(exp)
        exp.iteration = 0
        return out

    def _step(self, exp: Experience) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        exp.extras["updates"] = self.updates
        strategy = self.objective.update or default_update
        loss, metrics = strategy(self.objective, self.scorer, exp)
        out = {k: float(v.detach()) for k, v in metrics.items()}
        out["loss"] = float(loss.detach())
        # ranks in lockstep skip together: the gradient clipping below is a collective on them
        if not group_all(math.isfinite(out["loss"]), self.scorer.lockstep_group):
            return self._skip(out, "loss")
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if params else 0.0
        out["grad_norm"] = norm
        if not math.isfinite(norm):
            return self._skip(out, "gradient")
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.optim_cfg, self.updates)
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

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """Trainable weights only (LoRA adapters after `apply_lora`), for the rollout hand-off."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v.detach() for k, v in self.model.state_dict().items() if k in names}

    def state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates, "skipped": self.skipped,
                "optim_cfg": asdict(self.optim_cfg)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.skipped = int(state["skipped"])
