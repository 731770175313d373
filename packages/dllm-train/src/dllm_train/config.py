"""Configs of the trainer, validated on construction so a bad value fails before any work."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_objectives import SFT_NORMALIZERS
from dllm_train.packed_scoring import PACKED_BACKENDS

BACKENDS = ("local", "ray")
SCHEDULES = ("constant", "cosine")
BD3LM_LAYOUTS = ("shared", "doubled")


def check_sequence_parallel(sequence_parallel: int, ranks: int, *,
                            names: tuple[str, str] = ("sequence_parallel", "world_size")) -> None:
    """Raise unless `sequence_parallel` (>= 1) divides the `ranks` (the rule of every rank grid).

    Args:
        sequence_parallel: ranks that split every sequence.
        ranks: number of ranks (>= 1).
        names: the two fields as the message names them.
    """
    if sequence_parallel < 1 or ranks % sequence_parallel:
        sizes = [d for d in range(1, ranks + 1) if ranks % d == 0]
        raise ValueError(f"{names[0]}={sequence_parallel} must be >= 1 and divide {names[1]}={ranks}; "
                         f"choose one of {sizes}")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW settings.

    Attributes:
        lr: learning rate.
        weight_decay: decoupled weight decay.
        betas: Adam betas.
        grad_clip: max global grad norm (0 disables clipping).
        warmup_steps: linear warm-up steps.
        schedule: after warm-up, "constant" or "cosine" (decay to lr * min_lr_ratio).
        decay_steps: step at which the cosine reaches its floor (0: the phase's number of steps,
            which SFT and preference phases know; RL needs it set, e.g. to trainer.max_steps).
        min_lr_ratio: floor of the cosine as a fraction of lr.
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"
    decay_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule {self.schedule!r} unknown; choose one of {SCHEDULES}")
        if self.decay_steps < 0:
            raise ValueError(f"optim.decay_steps must be >= 0 (0: the phase length), got {self.decay_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """The outer loop.

    Attributes:
        max_steps: number of optimizer steps of the RL phase.
        seed: root seed; every step's randomness is derived from (seed, step), so a resumed run
            draws exactly what an uninterrupted one would.
        eval_every: held-out evaluation period in steps (0: only before and after).
        save_every: checkpoint period in steps (0: only at the end).
        keep_checkpoints: checkpoints kept in the run folder, newest first (>= 1). A new one is
            written completely before older ones are deleted, so at most keep_checkpoints + 1
            exist for a moment (each holds the weights and the optimizer state).
        log_every: progress-line period in steps.
        backend: "local" (in-process) or "ray" (Ray actors with FSDP2, same worker code).
        num_workers: ranks of the Ray backend (one actor each).
        sequence_parallel: ranks of the Ray backend that split every sequence (Ulysses sequence
            parallelism of the actor's likelihood passes; 1: none). Must divide num_workers (the
            rest is data parallelism: num_workers / sequence_parallel groups, each with its own
            rows) and the model's attention head count; needs backend="ray".
        gpus_per_worker: 0 (CPU, gloo) or 1 (one GPU per rank, nccl) for the Ray backend.
        consistency_every: every N RL steps, check the rollout against the trainer's model (0:
            never). Native rollouts replay their trajectory without cache and report the gap
            between rollout-side and recomputed log-probs (the rollout must record trajectories,
            `rollout.record_trajectory=true`); engine rollouts report a greedy probe's token
            agreement with the native decoder on the same weights (`EngineRolloutWorker.consistency`).
        save_rollouts_every: every N RL steps, store the step's rollout record in the run folder
            (`<output>/rollouts/step_XXXXXX.rankR.safetensors`, read back with
            `dllm_train.read_rollouts`; R: the data-parallel group whose rows it holds; 0: never).
        tensorboard: also write every metric to TensorBoard under `<output>/tensorboard/<phase>`.
        wandb: also log every metric to Weights & Biases (extra `dllm-train[wandb]`), as
            `<phase>/<metric>` against `<phase>/step`. Without WANDB_API_KEY (and no WANDB_MODE
            set) it runs offline, files under `<output>/wandb`; `wandb sync` uploads them later.
        wandb_project: W&B project name.
        wandb_run_name: W&B run name (empty: the output folder's name).
        train_attention: attention backend of the likelihood passes (old, reference, training,
            SFT, preference) on packed rows with the fused log-prob head: "varlen" / "flash_attn"
            (CUDA; bidirectional families), "bd3lm_kernel" (block families' BD3LM layout: the
            Triton kernel that visits only the visible tiles, `dllm_models.kernels.bd3lm_attention`;
            flex on CUDA / sdpa elsewhere for inputs it does not serve), "flex" (any family),
            "sdpa" (CPU too). "auto": varlen or bd3lm_kernel on CUDA (the exact fast paths; the kernel's
            update measured 1.27x flex's at SDAR-8B's RL recipe batch on the H200, docs/benchmarks.md); on CPU sdpa
            for block families (their padded layout runs a row per noised block) and the padded
            path for LLaDA/Dream. "none" or empty: the padded batch (its head in chunks of
            `dllm_models.logprob.LOGITS_CHUNK_ELEMENTS` logits). The rollout keeps the model's
            own backend. See `dllm_train.packed_scoring`.
        max_tokens_per_pass: token budget of one forward of every likelihood pass (old,
            reference, training; Monte-Carlo copies, BD3LM rows and replay states included): the
            rows of a pass are split into forwards of at most this many tokens
            (`Scorer.row_cost`) and the gradients accumulated so that loss and gradients equal
            the single-batch ones. 0: one forward per scorer call (no limit).
        bd3lm_layout: the BD3LM layout of block families on packed rows (`train_attention` set):
            "shared" (the Monte-Carlo copies of a sequence in one pass share one clean half,
            [x_0 ; x_t^1 ; ... ; x_t^k]: (k + 1) L tokens, priced so by the token budget) or
            "doubled" (every copy its own [x_t ; x_0] pair: 2 k L tokens; for comparison). Both
            compute the same values and gradients. See `dllm_train.packed_scoring`.
        activation_checkpointing: recompute decoder layers' activations in the backward of the
            training passes (less memory, up to one more forward of compute): only as many
            layers as `activation_memory_gib` needs, the first ones of each pass
            (`dllm_models.activation_memory`).
        activation_memory_gib: the device memory (GiB) a training step may use when
            activation_checkpointing is on: each training forward checkpoints the fewest layers
            that keep its projected peak (what the device holds at the pass, plus the measured
            activations per layer and 4 GiB of headroom) under it. 0: the device's total memory
            (CUDA; every layer on the CPU). Set it below the card (e.g. 76 on an 80 GB card)
            to stay under it; a budget smaller than the step's weights checkpoints every layer.
        reference_offload: keep the frozen reference model on the CPU between its passes
            (moved to the GPU for each pass), so it costs no second copy of the weights on the
            GPU. A LoRA run needs no copy at all: see `dllm_train.workers.ReferenceWorker`.
        fsdp_cpu_offload: Ray backend: FSDP2 keeps parameters, gradients and optimizer state on
            the CPU (`CPUOffloadPolicy`), moving each block to the GPU for its compute.
        optimizer_offload: RL steps keep the optimizer state (AdamW's two moments, twice the
            trained weights in bf16) in pinned host memory from the start of each rollout until
            the optimizer step reads it, so the rollout's KV cache and the training passes'
            activations can use that device memory; costs a device-to-host and a host-to-device
            copy of the state per step (`optimizer_offload_s`, `optimizer_restore_s`). See
            `dllm_train.offload`. Nothing to move under `fsdp_cpu_offload` (already on the CPU).
        max_nonfinite_steps: a phase stops with one error line after this many steps in a row
            skipped for a non-finite loss, gradient norm or reward (a skipped step changes neither
            the weights nor the optimizer state; nothing non-finite is ever checkpointed, and
            steps skipped only for their rewards set no checkpoint aside).
        num_threads: torch CPU threads of this process (0 keeps torch's default). Tiny models run
            fastest on one thread: OpenMP threads spin at every barrier, which costs more than the
            small matrix products gain, and collapses when another process shares the cores.
    """

    max_steps: int = 100
    seed: int = 0
    eval_every: int = 0
    save_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 1
    backend: str = "local"
    num_workers: int = 2
    sequence_parallel: int = 1
    gpus_per_worker: int = 0
    num_threads: int = 0
    consistency_every: int = 0
    save_rollouts_every: int = 0
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "dare"
    wandb_run_name: str = ""
    train_attention: str = "auto"
    max_tokens_per_pass: int = 0
    bd3lm_layout: str = "shared"
    activation_checkpointing: bool = False
    activation_memory_gib: float = 0.0
    reference_offload: bool = False
    fsdp_cpu_offload: bool = False
    optimizer_offload: bool = False
    max_nonfinite_steps: int = 3

    def __post_init__(self) -> None:
        if self.max_nonfinite_steps < 1:
            raise ValueError(f"trainer.max_nonfinite_steps must be >= 1 (steps in a row skipped for non-finite "
                             f"values before the run stops), got {self.max_nonfinite_steps}")
        choices = ("", "none", "auto", *PACKED_BACKENDS)
        if self.train_attention not in choices:
            raise ValueError(f"trainer.train_attention={self.train_attention!r} is not a packed attention backend; "
                             f"choose one of {choices[1:]} (or empty / none: the padded path)")
        if not self.activation_memory_gib >= 0:
            raise ValueError(f"trainer.activation_memory_gib must be >= 0 (GiB; 0: the device's memory), "
                             f"got {self.activation_memory_gib}")
        if self.max_tokens_per_pass < 0:
            raise ValueError(f"trainer.max_tokens_per_pass must be >= 0 (0: no limit), got {self.max_tokens_per_pass}")
        if self.bd3lm_layout not in BD3LM_LAYOUTS:
            raise ValueError(f"trainer.bd3lm_layout={self.bd3lm_layout!r} is not a layout; choose one of {BD3LM_LAYOUTS} "
                             "('shared': one clean half per group of Monte-Carlo copies)")
        if self.fsdp_cpu_offload and self.backend != "ray":
            raise ValueError("trainer.fsdp_cpu_offload=true shards with FSDP2 on Ray ranks; set trainer.backend=ray "
                             "(or trainer.reference_offload=true / trainer.activation_checkpointing=true locally)")
        if self.train_attention not in ("", "none", "auto") and self.sequence_parallel > 1:
            raise ValueError("trainer.train_attention (packed rows) and trainer.sequence_parallel > 1 cannot be "
                             "combined yet: the Ulysses split runs on the padded batch; unset one of them")
        if self.max_steps < 0:
            raise ValueError(f"trainer.max_steps must be >= 0, got {self.max_steps}")
        for name in ("eval_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"trainer.keep_checkpoints must be >= 1 (the newest checkpoint is what a run resumes "
                             f"from), got {self.keep_checkpoints}")
        if self.log_every < 1:
            raise ValueError(f"trainer.log_every must be >= 1, got {self.log_every}")
        if self.backend not in BACKENDS:
            raise ValueError(f"trainer.backend {self.backend!r} unknown; choose one of {BACKENDS}")
        if self.num_workers < 1:
            raise ValueError(f"trainer.num_workers must be >= 1, got {self.num_workers}")
        check_sequence_parallel(self.sequence_parallel, self.num_workers,
                                names=("trainer.sequence_parallel", "trainer.num_workers"))
        if self.sequence_parallel > 1 and self.backend != "ray":
            raise ValueError(f"trainer.sequence_parallel={self.sequence_parallel} splits sequences over Ray "
                             f"ranks; set trainer.backend=ray (got {self.backend!r}) or trainer.sequence_parallel=1")
        if self.consistency_every < 0:
            raise ValueError(f"trainer.consistency_every must be >= 0 (0: never), got {self.consistency_every}")
        if self.save_rollouts_every < 0:
            raise ValueError(f"trainer.save_rollouts_every must be >= 0 (0: never), got {self.save_rollouts_every}")
        if self.num_threads < 0:
            raise ValueError(f"trainer.num_threads must be >= 0 (0: torch's default), got {self.num_threads}")
        if self.gpus_per_worker not in (0, 1):
            raise ValueError(f"trainer.gpus_per_worker must be 0 or 1, got {self.gpus_per_worker}")
        if self.wandb and not self.wandb_project.strip():
            raise ValueError("trainer.wandb_project is empty while trainer.wandb=true; "
                             "set trainer.wandb_project=NAME (or trainer.wandb=false)")


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    """Batch shape of one RL step.

    Attributes:
        prompts_per_step: distinct prompts per rollout batch.
        group_size: samples per prompt (G of GRPO).

    The clipped-surrogate constants belong to each algorithm (`algorithm.clip_low`, ...).
    """

    prompts_per_step: int = 16
    group_size: int = 8

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1:
            raise ValueError(f"rl.prompts_per_step must be >= 1, got {self.prompts_per_step}")
        if self.group_size < 2:
            raise ValueError(
                f"rl.group_size must be >= 2 so group-relative advantages are defined, got {self.group_size}"
            )


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Masked-diffusion SFT phase.

    Attributes:
        steps: optimizer steps (0 skips the phase).
        batch_size: sequences per step.
        eps: smallest masking ratio t.
        normalizer: "masked" (batch sum / number of masked tokens), "response" (per-sequence
            sum / its response length) or "answer_len" (batch sum / number of response tokens);
            see `dllm_objectives.mdm_sft_loss`.
        weight_by_t: weight each masked token by 1/t (the LLaDA-paper NELBO).
    """

    steps: int = 0
    batch_size: int = 64
    eps: float = 1e-3
    normalizer: str = "masked"
    weight_by_t: bool = False

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"sft.steps must be >= 0, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"sft.batch_size must be >= 1, got {self.batch_size}")
        if not 0 < self.eps < 1:
            raise ValueError(f"sft.eps must be in (0, 1), got {self.eps}")
        if self.normalizer not in SFT_NORMALIZERS:
            raise ValueError(f"sft.normalizer {self.normalizer!r} unknown; choose one of {SFT_NORMALIZERS}")
