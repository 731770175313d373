"""The app's own sections of the run config (the others are the libraries' configs).

`task`/`model`/`eval` belong to the quick start, `checkpoint`/`data` to the checkpoint recipes,
`preference` to the preference recipes (see `dare.config.SECTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dare.config_tree import did_you_mean

DTYPES = ("bfloat16", "float16", "float32")
"""The parameter dtypes `checkpoint.dtype` takes (those `dllm_models.load_model` loads)."""


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """A LLaDA-architecture model built from scratch (quick start).

    Attributes:
        d_model, n_layers, n_heads, mlp_hidden_size: shape.
        rope_theta: RoPE base.
        init_std: std of the random initial weights.
    """

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_hidden_size: int = 384
    rope_theta: float = 10000.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out evaluation: greedy decoding with the rollout's block and step settings.

    Attributes:
        batch_size: prompts per decoding batch.
    """

    batch_size: int = 250

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True, kw_only=True)
class CheckpointModelConfig:
    """A released model folder.

    Attributes:
        checkpoint: path of the folder (config.json + safetensors); set by the user.
        family: 'llada', 'dream', 'sdar', 'sdar_moe' or 'llada2' (`dllm_models.FAMILY_NAMES`); checked
            against the checkpoint's config.json before any work.
        dtype: parameter dtype: 'bfloat16', 'float16' or 'float32' (`DTYPES`).
        lora_rank: LoRA rank (0: full fine-tuning); adapters only are handed to the rollout.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: dropout on the adapters' input during training (LoRA's `lora_dropout`).

    The adapters of every kind of run (RL, SFT, preference) come from here, applied once to the loaded
    policy (`lora()`, `dare.pipeline.policy_with_adapters`); with them a reference is the policy's own base
    weights, never a copy.
    """

    checkpoint: str = ""
    family: str = "llada"
    dtype: str = "bfloat16"
    lora_rank: int = 0
    lora_alpha: float = 64.0
    lora_dropout: float = 0.0

    def __post_init__(self) -> None:
        from dllm_models import FAMILY_NAMES

        if self.family not in FAMILY_NAMES:
            raise ValueError(f"checkpoint.family {self.family!r} unknown{did_you_mean(self.family, FAMILY_NAMES)}; "
                             f"choose one of {list(FAMILY_NAMES)} (dllm_models' family registry); it must be the "
                             "checkpoint's family")
        if self.dtype not in DTYPES:
            raise ValueError(f"checkpoint.dtype={self.dtype!r} is not a parameter dtype{did_you_mean(self.dtype, DTYPES)}; "
                             f"choose one of {list(DTYPES)}")
        if self.lora_rank < 0:
            raise ValueError(f"checkpoint.lora_rank must be >= 0 (0 disables LoRA), got {self.lora_rank}")
        if not self.lora_alpha > 0:
            raise ValueError(f"checkpoint.lora_alpha must be > 0 (LoRA scale = alpha / rank), got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"checkpoint.lora_dropout must be in [0, 1), got {self.lora_dropout}")

    def lora(self) -> Any:
        """The run's LoRA adapters (`dllm_algorithms.LoRA`), or None for full fine-tuning (`lora_rank` 0)."""
        from dllm_algorithms import LoRA

        return LoRA(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout) if self.lora_rank else None


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Training data.

    Attributes:
        train_files: comma-separated parquet paths (RL: or shipped dataset names); set by the user.
            Schemas: RL in `dare.rl_data`, SFT and preference in `dare.datasets`.
        eval_files: comma-separated dllm_eval benchmark names validated during training.
        eval_max_rows: rows of each `eval_files` benchmark scored at every validation (the first
            N, the same at every validation; default 64); 0: every row (slow on big benchmarks).
        max_prompt_length: longest chat-templated prompt in tokens (RL and SFT drop longer rows;
            preference keeps the last tokens).
        max_response_length: longest response in tokens (SFT drops longer rows; preference keeps
            the last tokens of each response).
    """

    train_files: str = ""
    eval_files: str = ""
    eval_max_rows: int = 64
    max_prompt_length: int = 512
    max_response_length: int = 512

    def __post_init__(self) -> None:
        for name in ("max_prompt_length", "max_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_max_rows < 0:
            raise ValueError(f"data.eval_max_rows must be >= 0 (0: every row), got {self.eval_max_rows}")


@dataclass(frozen=True, kw_only=True)
class PreferenceConfig:
    """Batch shape of a preference step (its steps are `trainer.max_steps`, its optimizer `preference_optim`).

    Attributes:
        pairs_per_step: (prompt, chosen, rejected) triples per optimizer step.
    """

    pairs_per_step: int = 64

    def __post_init__(self) -> None:
        if self.pairs_per_step < 1:
            raise ValueError(f"preference.pairs_per_step must be >= 1, got {self.pairs_per_step}")


__all__ = ["DTYPES", "CheckpointModelConfig", "DataConfig", "EvalConfig", "PreferenceConfig", "TinyModelConfig"]
