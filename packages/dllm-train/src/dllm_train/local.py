"""The local backend: the RL phase in one process, one rank whose rollout and actor share the model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dllm_rollout import SamplingConfig
from dllm_train.algorithm import RLAlgorithm
from dllm_train.assembly import assemble_rank
from dllm_train.config import OptimConfig, TrainerConfig
from dllm_train.rollout_record import RolloutSaver
from dllm_train.seeding import generator
from dllm_train.step import LocalRanks, PromptSampler, check_settings, rl_step
from dllm_train.workers import ActorWorker, RewardWorker


class LocalRL:
    """The RL phase in one process: one `PolicyRank` whose rollout and actor share `model`.

    Its workers come from `dllm_train.assemble_rank`, the rule the Ray ranks use too: a frozen
    copy of the initial policy only when the algorithm needs one (kept on the CPU between its
    passes with `trainer.reference_offload`), none under LoRA. `step` is the same
    `dllm_train.rl_step` the Ray backend runs.

    Args:
        model: the policy (trained in place).
        prompts: step -> PromptBatch.
        sampling: the run's decoding settings.
        reward_fn, detokenize: the verifier and the token decoder.
        algorithm: the RL algorithm.
        optim: the actor's optimizer settings.
        trainer: the trainer settings (seed, token budget, attention, memory levers).
        engine_folder: the checkpoint folder an inference engine loads (`rollout.engine`).
        output_dir: the run folder, where `trainer.save_rollouts_every` stores rollout records
            (None: none are stored).
    """

    def __init__(self, model: Any, *, prompts: PromptSampler, sampling: SamplingConfig,
                 reward_fn: Callable[[str, str], float], detokenize: Callable[[list[int]], str],
                 algorithm: RLAlgorithm[Any], optim: OptimConfig, trainer: TrainerConfig,
                 engine_folder: str | None = None, output_dir: str | Path | None = None) -> None:
        check_settings(algorithm, sampling, consistency_every=trainer.consistency_every)
        self.prompts = prompts
        self.algorithm = algorithm
        self.seed = trainer.seed
        self.rank = assemble_rank(model, sampling=sampling, algorithm=algorithm, optim=optim, trainer=trainer,
                                  reward=RewardWorker(reward_fn, detokenize),
                                  plan_generator=lambda step: generator(self.seed, "plan", step),
                                  engine_folder=engine_folder, save_rollout=_saver(trainer, output_dir))
        self.actor: ActorWorker[Any] = self.rank.actor
        self.ranks = LocalRanks(self.rank)

    def step(self, step: int) -> dict[str, float]:
        return rl_step(step, prompts=self.prompts, ranks=self.ranks, algorithm=self.algorithm, seed=self.seed)

    def state(self) -> dict[str, Any]:
        """The actor's optimizer state and counters, and with a value model its weights and
        optimizer state (`critic`), checkpointed together."""
        state = self.actor.state()
        if self.rank.critic is not None:
            state["critic"] = self.rank.critic.state()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        self.actor.load_state(state)
        if self.rank.critic is not None:
            if "critic" not in state:
                raise ValueError(f"algorithm {self.algorithm.label} trains a value model, but the checkpoint holds "
                                 "none (it was written by a run without one): resume with the algorithm of that run, "
                                 "or choose a new --output-dir")
            self.rank.critic.load_state(state["critic"])


def _saver(trainer: TrainerConfig, output_dir: str | Path | None) -> RolloutSaver | None:
    """The rollout store of `trainer.save_rollouts_every` in `output_dir` (None when off)."""
    if not trainer.save_rollouts_every:
        return None
    if output_dir is None:
        raise ValueError(f"trainer.save_rollouts_every={trainer.save_rollouts_every} stores rollouts in the run "
                         "folder: pass LocalRL(..., output_dir=<run folder>)")
    return RolloutSaver(output_dir, trainer.save_rollouts_every)


__all__ = ["LocalRL"]
