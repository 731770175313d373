"""Run-config fields for recipes on released checkpoints (GPU runs), pending their move into RunConfig."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from dare.config import RunConfig, _coerce


@dataclass(frozen=True, kw_only=True)
class CheckpointModelConfig:
    """A released model folder.

    Attributes:
        checkpoint: path of the folder (config.json + safetensors); set by the user.
        family: 'llada', 'dream', 'sdar', 'sdar_moe' or 'llada2'.
        dtype: parameter dtype.
        lora_rank: LoRA rank (0: full fine-tuning); adapters only are handed to the rollout.
        lora_alpha: LoRA scaling numerator.
    """

    checkpoint: str = ""
    family: str = "llada"
    dtype: str = "bfloat16"
    lora_rank: int = 0
    lora_alpha: float = 64.0

    def __post_init__(self) -> None:
        from dare.algorithms import ALL_FAMILIES

        if self.family not in ALL_FAMILIES:
            raise ValueError(f"checkpoint.family {self.family!r} unknown; choose one of {list(ALL_FAMILIES)}")
        if self.lora_rank < 0:
            raise ValueError(f"checkpoint.lora_rank must be >= 0 (0 disables LoRA), got {self.lora_rank}")
        if not self.lora_alpha > 0:
            raise ValueError(f"checkpoint.lora_alpha must be > 0 (LoRA scale = alpha / rank), got {self.lora_alpha}")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Training data.

    Attributes:
        train_files: comma-separated parquet paths (RL: or shipped dataset names); set by the user.
            Schemas: RL in `pipeline.read_rl_rows`, SFT and preference in `dare.datasets`.
        eval_files: comma-separated dllm_eval benchmark names validated during training.
        max_prompt_length: longest chat-templated prompt in tokens (RL and SFT drop longer rows;
            preference keeps the last tokens).
        max_response_length: longest response in tokens (SFT drops longer rows; preference keeps
            the last tokens of each response).
    """

    train_files: str = ""
    eval_files: str = ""
    max_prompt_length: int = 512
    max_response_length: int = 512

    def __post_init__(self) -> None:
        for name in ("max_prompt_length", "max_response_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class PreferenceConfig:
    """Batch shape of a preference step (its steps are `trainer.max_steps`, its optimizer `rl_optim`).

    Attributes:
        pairs_per_step: (prompt, chosen, rejected) triples per optimizer step.
    """

    pairs_per_step: int = 64

    def __post_init__(self) -> None:
        if self.pairs_per_step < 1:
            raise ValueError(f"preference.pairs_per_step must be >= 1, got {self.pairs_per_step}")


@dataclass(frozen=True, kw_only=True)
class RecipeRunConfig(RunConfig):
    """RunConfig + checkpoint, data and algorithm hyper-parameter overrides.

    Attributes:
        checkpoint: the model folder.
        data: dataset paths and lengths.
        preference: batch shape of preference algorithms.
        algorithm_args: "field=value" overrides of the algorithm's registry dataclass.
    """

    checkpoint: CheckpointModelConfig = field(default_factory=CheckpointModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    algorithm_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from dare.algorithms import SFT_ALGORITHMS

        entry = resolve_algorithm(self)
        if self.checkpoint.family not in entry.families:
            raise ValueError(f"algorithm {self.algorithm!r} is defined for {list(entry.families)}, "
                             f"not family {self.checkpoint.family!r}")
        if self.algorithm in SFT_ALGORITHMS:
            _check_sft_fields(self)


# SFT entry fields that a recipe run reads from elsewhere: the loss settings from `sft.*`, the
# adapters from `checkpoint.lora_*` (as RL recipes do), so each value has one home.
_SFT_ELSEWHERE = {"normalizer": "sft.normalizer", "weight_by_t": "sft.weight_by_t", "eps": "sft.eps",
                  "lora": "checkpoint.lora_rank / checkpoint.lora_alpha"}


def _check_sft_fields(cfg: RecipeRunConfig) -> None:
    from dare.algorithms import SFT_ALGORITHMS

    for item in cfg.algorithm_args:
        key = item.partition("=")[0]
        if key in _SFT_ELSEWHERE:
            raise ValueError(f"algorithm_args {item!r}: recipe runs take {key} from {_SFT_ELSEWHERE[key]}; "
                             f"drop it from algorithm_args and set {_SFT_ELSEWHERE[key]} instead")
    if SFT_ALGORITHMS[cfg.algorithm].lora is not None and cfg.checkpoint.lora_rank < 1:
        raise ValueError(f"algorithm {cfg.algorithm!r} trains LoRA adapters but checkpoint.lora_rank="
                         f"{cfg.checkpoint.lora_rank}; set checkpoint.lora_rank=16 (or another rank >= 1), "
                         "or use algorithm sft for full fine-tuning")


def resolve_algorithm(cfg: RecipeRunConfig) -> Any:
    """The registry entry of `cfg.algorithm` with `cfg.algorithm_args` applied (validated)."""
    from dare.algorithms import ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS

    tables: dict[str, Any] = {**ALGORITHMS, **PREFERENCE_ALGORITHMS, **SFT_ALGORITHMS}
    if cfg.algorithm not in tables:
        raise ValueError(f"algorithm {cfg.algorithm!r} is unknown; choose one of {sorted(tables)}")
    entry = tables[cfg.algorithm]
    names = {f.name: f for f in dataclasses.fields(entry)}
    changes: dict[str, Any] = {}
    for item in cfg.algorithm_args:
        key, _, raw = item.partition("=")
        if key not in names or key == "families":
            raise ValueError(f"algorithm_args {item!r}: {cfg.algorithm} has {sorted(set(names) - {'families'})}")
        changes[key] = _coerce(raw, typing.get_type_hints(type(entry))[key], key)
    return dataclasses.replace(entry, **changes)
