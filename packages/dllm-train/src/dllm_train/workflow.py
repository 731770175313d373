"""Workflow: the outer loop of a run, its phases, checkpoints and exact resume.

A run is a sequence of phases (e.g. SFT then RL). Each phase is a step function called for steps
`start..steps-1`; all randomness of a step derives from (seed, phase, step) (see `seeding`), so a
run resumed from its latest checkpoint continues exactly as the uninterrupted run would.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from dllm_train.checkpointing import latest_checkpoint, load_checkpoint, save_checkpoint
from dllm_rollout import SamplingConfig, consistency_gap
from dllm_train.config import OptimConfig, RLConfig, TrainerConfig
from dllm_train.dataflow import Experience, PromptBatch
from dllm_train.metrics import MetricsWriter, format_line, read_metrics
from dllm_train.objective import PolicyObjective
from dllm_train.packed_scoring import use_training_attention
from dllm_train.seeding import generator, sample_seeds
from dllm_train.workers import ActorWorker, ReferenceWorker, RewardWorker, RolloutWorker

logger = logging.getLogger(__name__)


class Stateful(Protocol):
    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class PhaseSpec:
    """One phase of a run.

    Attributes:
        order: position of the phase in the run (0, 1, ...).
        name: short lowercase name ("sft", "rl"); also names its metrics file.
        steps: number of steps.
        step_fn: runs step `i` (0-based) and returns its metrics.
        owner: the object whose optimizer state is checkpointed with the phase.
        save_every: checkpoint period (0: only at the end).
        eval_fn: held-out evaluation returning metrics, run every `eval_every` steps.
        eval_every: evaluation period (0: never inside the phase).
        on_end: called once after the last step; its results are stored with the run.
        metrics_file: file name of the phase's metrics under the output folder.
        log_keys: metrics shown in the one-line summaries.
    """

    order: int
    name: str
    steps: int
    step_fn: Callable[[int], dict[str, float]]
    owner: Stateful
    save_every: int = 0
    eval_fn: Callable[[], dict[str, float]] | None = None
    eval_every: int = 0
    on_end: Callable[[], dict[str, Any]] | None = None
    metrics_file: str = "metrics.jsonl"
    log_keys: Sequence[str] = ()


class Run:
    """Drives phases with checkpoints; resumes from the latest checkpoint in `output_dir`.

    Args:
        output_dir: the run folder (metrics, checkpoints).
        model: the module checkpointed with every phase (loaded from the latest checkpoint).
        tokenizer: saved with each checkpoint.
        log_every: one-line summary period in steps.
        progress: show a progress bar.
        tensorboard: also write metrics to `<output_dir>/tensorboard/<phase>`.
        wandb_run: an open W&B run (`metrics.open_wandb`) that also receives every metric;
            `close()` finishes it.
    """

    def __init__(self, output_dir: Path, model: Any, *, tokenizer: Any = None, log_every: int = 1,
                 progress: bool = True, tensorboard: bool = False, wandb_run: Any = None) -> None:
        self.output_dir = output_dir
        self.tensorboard = tensorboard
        self.wandb_run = wandb_run
        self.model = model
        self.tokenizer = tokenizer
        self.log_every = log_every
        self.progress = progress
        self.latest = latest_checkpoint(output_dir)
        self.state: dict[str, Any] = load_checkpoint(self.latest, model) if self.latest else {}
        self.results: dict[str, Any] = dict(self.state.get("results", {}))
        if self.latest is not None:
            logger.info("resuming from %s", self.latest.path)

    def _start(self, spec: PhaseSpec) -> int | None:
        """First step to run, or None if the phase already finished."""
        if self.latest is None or self.latest.order < spec.order:
            return 0
        if self.latest.order > spec.order or self.latest.step >= spec.steps:
            return None
        spec.owner.load_state(self.state["owner"])
        return self.latest.step

    def _save(self, spec: PhaseSpec, step: int) -> None:
        state = {"owner": spec.owner.state(), "results": self.results}
        save_checkpoint(self.output_dir, order=spec.order, phase=spec.name, step=step,
                        model=self.model, state=state, tokenizer=self.tokenizer)

    def run_phase(self, spec: PhaseSpec) -> None:
        start = self._start(spec)
        if start is None:
            logger.info("phase %s already complete; skipping", spec.name)
            return
        tb_dir = self.output_dir / "tensorboard" / spec.name if self.tensorboard else None
        writer = MetricsWriter(self.output_dir / spec.metrics_file, resume_step=start, tensorboard_dir=tb_dir,
                               wandb_run=self.wandb_run, phase=spec.name)
        bar = tqdm(total=spec.steps, initial=start, desc=spec.name, disable=not self.progress,
                   dynamic_ncols=True, leave=False)
        try:
            for i in range(start, spec.steps):
                record: dict[str, Any] = {"step": i + 1, **spec.step_fn(i)}
                if spec.eval_fn is not None and spec.eval_every and (i + 1) % spec.eval_every == 0:
                    record.update(spec.eval_fn())
                writer.write(record)
                bar.update(1)
                if (i + 1) % self.log_every == 0 or i + 1 == spec.steps:
                    logger.info("%s %s", spec.name, format_line(record, spec.log_keys))
                if spec.save_every and (i + 1) % spec.save_every == 0 and i + 1 < spec.steps:
                    self._save(spec, i + 1)
        finally:
            bar.close()
            writer.close()
        if spec.on_end is not None:
            self.results.update(spec.on_end())
        self._save(spec, spec.steps)

    def metrics(self, spec_name_file: str = "metrics.jsonl") -> list[dict[str, Any]]:
        path = self.output_dir / spec_name_file
        return read_metrics(path) if path.exists() else []

    def close(self) -> None:
        """Finish the W&B run, if any (metrics files need no closing)."""
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


PromptSampler = Callable[[int], PromptBatch]
"""step -> the prompts of that step (deterministic in step)."""


class RLWorkflow:
    """generate -> reward -> old log-probs (+ reference) -> advantages -> update."""

    def __init__(self, *, prompts: PromptSampler, rollout: RolloutWorker, reward: RewardWorker,
                 actor: ActorWorker, objective: PolicyObjective, trainer: TrainerConfig, rl: RLConfig,
                 reference: ReferenceWorker | None = None) -> None:
        if objective.needs_reference and reference is None:
            raise ValueError(f"algorithm {objective.name!r} needs a reference model; pass reference=")
        if trainer.consistency_every and not rollout.sampling.record_trajectory:
            raise ValueError(
                f"trainer.consistency_every={trainer.consistency_every} needs recorded trajectories; "
                "set rollout.record_trajectory=true (or trainer.consistency_every=0)"
            )
        if rollout.sampling.editing_threshold is not None:
            replays = [k for k in ("record_trajectory", "record_steps") if objective.sampling_overrides.get(k)]
            if replays or trainer.consistency_every:
                why = (f"algorithm {objective.name!r} reads the rollout's trajectory ({', '.join(replays)})"
                       if replays else f"trainer.consistency_every={trainer.consistency_every} replays it")
                raise ValueError(
                    f"{why}, but rollout.editing_threshold={rollout.sampling.editing_threshold} lets the decoder "
                    "rewrite committed tokens, which no step replay reproduces: unset rollout.editing_threshold, "
                    "or use an algorithm that does not read trajectories (and trainer.consistency_every=0)"
                )
        self.prompts = prompts
        self.rollout = rollout
        self.reward = reward
        self.actor = actor
        self.objective = objective
        self.trainer = trainer
        self.rl = rl
        self.reference = reference

    def step(self, step: int) -> dict[str, float]:
        seed = self.trainer.seed
        batch = self.prompts(step)
        prompts, answers, groups = batch.expanded()
        rollout = self.rollout.generate(prompts, sample_seeds(seed, len(prompts), "rollout", step))
        scores, texts = self.reward.score(rollout, answers)
        exp = Experience(rollout=rollout, scores=scores, group_ids=groups, texts=texts)
        self.actor.prepare(exp, generator(seed, "plan", step))
        if self.reference is not None:
            exp.ref_logp = self.reference.log_probs(exp, self.objective)
        exp.advantages = self.objective.advantages(scores, groups)
        gap: dict[str, float] = {}
        every = self.trainer.consistency_every
        if every and (step + 1) % every == 0:
            # the trainer's replay of the rollout, with the weights that generated it (before the update)
            gap = {f"consistency_{k}": float(v) for k, v in consistency_gap(self.actor.model, rollout).items()}
        metrics = self.actor.update(exp)
        metrics.update(gap)
        lengths = rollout.response_mask.float().sum(-1)
        metrics.update({
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "response_length": float(lengths.mean()),
            "groups_all_equal": float(_all_equal_groups(scores, groups)),
        })
        return metrics


def _all_equal_groups(scores: torch.Tensor, groups: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal (they carry no GRPO signal)."""
    equal = [bool((scores[groups == g] == scores[groups == g][0]).all()) for g in torch.unique(groups)]
    return sum(equal) / max(1, len(equal))


def local_rl_workflow(
    model: Any, *, prompts: PromptSampler, sampling: SamplingConfig, reward_fn: Callable[[str, str], float],
    detokenize: Callable[[list[int]], str], objective: PolicyObjective, optim: OptimConfig,
    trainer: TrainerConfig, rl: RLConfig,
) -> RLWorkflow:
    """An in-process RLWorkflow whose rollout and actor share `model` (colocated, no hand-off).

    A frozen copy of the initial policy is made only when the objective needs one, for the
    reference pass and/or for reference log-probs recorded during the rollout.
    """
    use_training_attention(model, trainer.train_attention or None)
    frozen = None
    if objective.needs_reference or objective.needs_rollout_reference:
        frozen = copy.deepcopy(model).eval()
    return RLWorkflow(
        prompts=prompts,
        rollout=RolloutWorker(model, sampling, objective=objective,
                              ref_model=frozen if objective.needs_rollout_reference else None),
        reward=RewardWorker(reward_fn, detokenize),
        actor=ActorWorker(model, objective, optim), objective=objective, trainer=trainer, rl=rl,
        reference=ReferenceWorker(frozen) if objective.needs_reference and frozen is not None else None,
    )
