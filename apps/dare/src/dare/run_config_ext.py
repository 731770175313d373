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


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Training data.

    Attributes:
        train_files, eval_files: dataset paths (parquet/jsonl); set by the user.
        max_prompt_length: prompts are left-truncated to this many tokens.
    """

    train_files: str = ""
    eval_files: str = ""
    max_prompt_length: int = 512

    def __post_init__(self) -> None:
        if self.max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length must be >= 1, got {self.max_prompt_length}")


@dataclass(frozen=True, kw_only=True)
class RecipeRunConfig(RunConfig):
    """RunConfig + checkpoint, data and algorithm hyper-parameter overrides.

    Attributes:
        checkpoint: the model folder.
        data: dataset paths and lengths.
        algorithm_args: "field=value" overrides of the algorithm's registry dataclass.
    """

    checkpoint: CheckpointModelConfig = field(default_factory=CheckpointModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        entry = resolve_algorithm(self)
        if self.checkpoint.family not in entry.families:
            raise ValueError(f"algorithm {self.algorithm!r} is defined for {list(entry.families)}, "
                             f"not family {self.checkpoint.family!r}")


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
