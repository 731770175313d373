"""A run: the outer loop over its phases, with checkpoints and exact resume.

A run is a sequence of phases (e.g. SFT then RL). Each phase is a step function called for steps
`start..steps-1`; all randomness of a step derives from (seed, phase, step) (see `seeding`), so a
run resumed from its latest checkpoint continues exactly as the uninterrupted run would.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from tqdm import tqdm

from dllm_rollout import NonFiniteLogits
from dllm_train.checkpointing import (
    SHARDS,
    checkpoint_path,
    list_checkpoints,
    new_checkpoint,
    resume_checkpoint,
    set_aside,
    write_checkpoint_files,
)
from dllm_train.config import TrainerConfig
from dllm_train.metrics import MetricsWriter, format_line, read_metrics
from dllm_train.preemption import Diverged, Interrupted, StopRequest

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class Stateful(Protocol):
    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class ShardedStateful(Protocol):
    """An owner whose parameters and optimizer state live sharded over ranks (the Ray backend).

    Its ranks write their own shards into a checkpoint's `shards/` folder and read them back, so
    nothing is gathered into one process: `state()` then holds only the small rest (counters).
    """

    def save_shards(self, folder: Path) -> None: ...

    def load_shards(self, folder: Path) -> None: ...


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
        keep_checkpoints: checkpoints kept in `output_dir` (the newest ones).
        progress: show a progress bar.
        tensorboard: also write metrics to `<output_dir>/tensorboard/<phase>`.
        wandb_run: an open W&B run (`metrics.open_wandb`) that also receives every metric;
            `close()` finishes it.
        max_nonfinite_steps: a phase stops (`Diverged`) after this many steps in a row skipped
            for a non-finite loss or gradient norm (their `skipped` metric).
        trust_legacy: resume from a checkpoint without a manifest (the layout written before
            manifests); otherwise such a newest checkpoint is refused (`LegacyCheckpointRefused`).

    Starting, it removes the leftovers of interrupted checkpoint writes and resumes from the
    newest intact checkpoint, setting damaged ones aside (`checkpointing.resume_checkpoint`).
    During a phase, SIGTERM or SIGINT lets the current step finish, writes a checkpoint and
    raises `Interrupted` (a second signal raises it at once, without a checkpoint). Nothing is
    saved while a parameter is non-finite (`Diverged`).

    The divergence guard tells the weights' fault from the rewards': a step skipped for a
    non-finite reward (`reward_nonfinite` in its metrics, see `rl_step`) leaves the weights
    finite and unchanged, so a run stopped by such steps sets nothing aside and resumes from its
    newest checkpoint. Steps skipped for a non-finite loss or gradient norm with finite rewards
    blame the weights of the last update: no periodic checkpoint is written while they last
    (it would prune the last checkpoint whose weights gave a finite step), and when the run stops,
    the checkpoints holding those weights are set aside.
    """

    def __init__(self, output_dir: Path, model: Any, *, tokenizer: Any = None, log_every: int = 1,
                 keep_checkpoints: int = 2, progress: bool = True, tensorboard: bool = False,
                 wandb_run: Any = None, max_nonfinite_steps: int = 3, trust_legacy: bool = False) -> None:
        self.output_dir = output_dir
        self.tensorboard = tensorboard
        self.wandb_run = wandb_run
        self.model = model
        self.tokenizer = tokenizer
        self.log_every = log_every
        self.keep_checkpoints = keep_checkpoints
        self.progress = progress
        self.max_nonfinite_steps = max_nonfinite_steps
        self.suspect = False  # the current streak of skipped steps blames the weights (not only the rewards)
        self.latest, self.state = resume_checkpoint(output_dir, model, trust_legacy=trust_legacy)
        self.latest_saved: Path | None = None
        self.results: dict[str, Any] = dict(self.state.get("results", {}))
        if self.latest is not None:
            logger.info("resuming from %s", self.latest.path)

    @classmethod
    def from_trainer(cls, output_dir: Path, model: Any, trainer: TrainerConfig, *, tokenizer: Any = None,
                     progress: bool = True, wandb_run: Any = None, trust_legacy: bool = False) -> Run:
        """A run with the trainer's logging period, checkpoint count and TensorBoard switch."""
        return cls(output_dir, model, tokenizer=tokenizer, log_every=trainer.log_every,
                   keep_checkpoints=trainer.keep_checkpoints, progress=progress, tensorboard=trainer.tensorboard,
                   wandb_run=wandb_run, max_nonfinite_steps=trainer.max_nonfinite_steps, trust_legacy=trust_legacy)

    def _start(self, spec: PhaseSpec) -> int | None:
        """First step to run, or None if the phase already finished."""
        if self.latest is None or self.latest.order < spec.order:
            return 0
        if self.latest.order == spec.order and self.latest.phase != spec.name:
            raise ValueError(f"the newest checkpoint {self.latest.path} is of phase {self.latest.phase!r}, but this "
                             f"run's phase {spec.order} is {spec.name!r}: the folder holds another kind of run; "
                             "choose a new --output-dir")
        if self.latest.order > spec.order or self.latest.step >= spec.steps:
            return None
        owner, shards = spec.owner, self.latest.path / SHARDS
        if shards.is_dir() and not isinstance(owner, ShardedStateful):
            raise ValueError(f"the checkpoint {self.latest.path} keeps its optimizer state as Ray ranks' shards "
                             f"({SHARDS}/); resume it with trainer.backend=ray, or start a new --output-dir")
        owner.load_state(self.state["owner"])
        if isinstance(owner, ShardedStateful) and shards.is_dir():
            owner.load_shards(shards)
        return self.latest.step

    def _save(self, spec: PhaseSpec, step: int) -> Path:
        """Checkpoint the phase after `step` steps; raises `Diverged` (nothing written) on non-finite weights."""
        with new_checkpoint(self.output_dir, order=spec.order, phase=spec.name, step=step,
                            keep=self.keep_checkpoints) as folder:
            if isinstance(spec.owner, ShardedStateful):  # also refreshes a Ray driver's model
                spec.owner.save_shards(folder / SHARDS)
            self._check_weights(spec, step)
            state = {"owner": spec.owner.state(), "results": self.results}
            write_checkpoint_files(folder, model=self.model, state=state, tokenizer=self.tokenizer)
        self.latest_saved = checkpoint_path(self.output_dir, spec.order, spec.name, step)
        return self.latest_saved

    def _check_weights(self, spec: PhaseSpec, step: int) -> None:
        """Raise `Diverged` if a parameter holds a non-finite value (nothing may checkpoint them)."""
        bad = next((n for n, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())), None)
        if bad is not None:
            raise Diverged(f"{spec.name} step {step}: parameter {bad} holds non-finite values, so no checkpoint "
                           f"is written; {self._resume_point()}. Lower the phase's learning rate (e.g. "
                           "rl_optim.lr, sft_optim.lr) or its grad_clip")

    def _resume_point(self) -> str:
        saved = self.latest_saved or (self.latest.path if self.latest else None)
        return f"a rerun resumes from {saved}" if saved else "no checkpoint exists yet: a rerun starts over"

    def _check_finite(self, spec: PhaseSpec, step: int, record: dict[str, Any], streak: int) -> int:
        """The new count of non-finite steps in a row; raises `Diverged` when it reaches the limit.

        A step skipped for a non-finite reward (`reward_nonfinite`) counts, but says nothing about
        the weights; only a non-finite loss or gradient norm with finite rewards makes the weights
        suspect (`self.suspect`), and only then are checkpoints set aside.
        """
        if not record.get("skipped"):
            self.suspect = False
            return 0
        streak += 1
        self.suspect = self.suspect or not record.get("reward_nonfinite")
        if streak < self.max_nonfinite_steps:
            return streak
        limit = f"trainer.max_nonfinite_steps={self.max_nonfinite_steps}"
        if not self.suspect:
            raise Diverged(
                f"{spec.name} step {step}: {streak} steps in a row were skipped for a non-finite reward ({limit}): "
                f"reward non-finite in {record.get('reward_nonfinite', 0):.0f} row(s) of the last step (named in the "
                "warnings above); the reward function returned NaN or inf, so no update was made and the "
                f"weights are unchanged and finite: nothing was set aside, {self._resume_point()}. Fix the reward "
                "function (or the rows' ground truth) and rerun")
        aside = self._set_aside_unconfirmed(spec, step - streak)
        loss = record.get("loss")
        raise Diverged(
            f"{spec.name} step {step}: {streak} steps in a row had a non-finite loss or gradient norm with finite "
            f"rewards (last loss {loss}) and were skipped ({limit}); stopped without saving{aside}, "
            f"{self._resume_point()}. Lower the phase's learning rate (e.g. rl_optim.lr, sft_optim.lr) or its grad_clip")

    def _guarded(self, spec: PhaseSpec, i: int, streak: int, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` at step index `i`; non-finite logits in it (`NonFiniteLogits`: the weights of the
        last update overflow) stop the run like non-finite steps: one `Diverged`, the checkpoints
        holding those weights set aside."""
        try:
            return fn(*args)
        except NonFiniteLogits as err:
            aside = self._set_aside_unconfirmed(spec, i - streak)
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise Diverged(
                f"{spec.name} step {i + 1}: the model's logits were not finite with the weights of {spec.name} "
                f"step {i - streak} ({first}); stopped without saving{aside}, {self._resume_point()}. Lower the "
                "phase's learning rate (e.g. rl_optim.lr, sft_optim.lr) or its grad_clip") from None

    def _set_aside_unconfirmed(self, spec: PhaseSpec, suspect_from: int) -> str:
        """Set aside this phase's checkpoints from step `suspect_from` on: they hold the weights of update
        `suspect_from`, with which no step computed a finite loss and gradient (what a too-large
        learning rate leaves: huge but finite weights). Returns a clause for the message."""
        bad = [r for r in list_checkpoints(self.output_dir) if r.order == spec.order and r.step >= suspect_from]
        for ref in bad:
            set_aside(ref.path, f"its weights (those of {spec.name} step {suspect_from}) gave only non-finite steps")
        self.latest_saved = None
        kept = list_checkpoints(self.output_dir)
        self.latest = kept[-1] if kept else None
        return f" and set aside {len(bad)} checkpoint(s) holding the weights that diverged" if bad else ""

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
        stop, streak = StopRequest(), 0
        self.suspect = False
        try:
            with stop.catching():
                for i in range(start, spec.steps):
                    record: dict[str, Any] = {"step": i + 1, **self._guarded(spec, i, streak, spec.step_fn, i)}
                    if spec.eval_fn is not None and spec.eval_every and (i + 1) % spec.eval_every == 0:
                        record.update(self._guarded(spec, i, streak, spec.eval_fn))
                    writer.write(record)
                    bar.update(1)
                    if (i + 1) % self.log_every == 0 or i + 1 == spec.steps:
                        logger.info("%s %s", spec.name, format_line(record, spec.log_keys))
                    streak = self._check_finite(spec, i + 1, record, streak)
                    if stop.signum is not None and i + 1 < spec.steps:
                        logger.warning("%s: saving a checkpoint at %s step %d", stop.name, spec.name, i + 1)
                        raise Interrupted(stop.signum, self._save(spec, i + 1))
                    if spec.save_every and (i + 1) % spec.save_every == 0 and i + 1 < spec.steps:
                        if self.suspect:  # unconfirmed weights must not prune the last confirmed checkpoint
                            self._check_weights(spec, i + 1)
                            logger.warning("%s step %d: no checkpoint while the weights give only non-finite "
                                           "steps", spec.name, i + 1)
                        else:
                            self._save(spec, i + 1)
                if spec.on_end is not None:
                    self.results.update(self._guarded(spec, spec.steps, streak, spec.on_end))
                self._save(spec, spec.steps)
            if stop.signum is not None:
                raise Interrupted(stop.signum, self.latest_saved)
        finally:
            bar.close()
            writer.close()

    def metrics(self, spec_name_file: str = "metrics.jsonl") -> list[dict[str, Any]]:
        path = self.output_dir / spec_name_file
        return read_metrics(path) if path.exists() else []

    def close(self) -> None:
        """Finish the W&B run, if any (metrics files need no closing)."""
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


__all__ = ["PhaseSpec", "Run", "ShardedStateful", "Stateful"]
