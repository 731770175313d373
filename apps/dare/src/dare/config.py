"""The run config: nested frozen dataclasses, dotted overrides, and a JSON form for --config."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dare.tasks.addition import AdditionConfig
from dllm_rollout import SamplingConfig
from dllm_train import OptimConfig, RLConfig, SFTConfig, TrainerConfig


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
class RunConfig:
    """Everything a `dare train` run needs; written resolved to `config.json` in the output folder."""

    recipe: str = "quickstart"
    algorithm: str = "d1"
    task: AdditionConfig = field(default_factory=AdditionConfig)
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    sft_optim: OptimConfig = field(default_factory=OptimConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    rl_optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0)
    )
    eval: EvalConfig = field(default_factory=EvalConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


def to_dict(cfg: Any) -> Any:
    """A JSON-ready dict of a (nested) dataclass config."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple):
        return list(cfg)
    return cfg


def from_dict(cls: type[Any], data: dict[str, Any]) -> Any:
    """Rebuild a config dataclass from `to_dict` output (validation runs again)."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            kwargs[f.name] = from_dict(typing.cast(type[Any], hint), value)
        else:
            kwargs[f.name] = _coerce(value, hint, f.name)
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)} for {cls.__name__}")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert a parsed override or JSON value to the field's type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{name}: cannot read {value!r} as {hint}")
    if origin is tuple:
        items = json.loads(value) if isinstance(value, str) else value
        return tuple(_coerce(v, a, name) for v, a in zip(items, args))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1", "yes"):
            return True
        if str(value).lower() in ("false", "0", "no"):
            return False
        raise ValueError(f"{name}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            return int(value)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected an integer, got {value!r}") from None
        if not number.is_integer():
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        return int(number)
    if hint is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if hint is str:
        return str(value)
    return value


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    """Apply `a.b.c=value` overrides to a nested frozen dataclass.

    Overrides of the same component are applied together, so fields validated against each
    other (e.g. `rollout.max_new_tokens` and `rollout.block_length`) can change in one command.

    Raises:
        ValueError: naming the key and the valid keys when a path does not exist.
    """
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value, e.g. trainer.max_steps=10")
        key, raw = item.split("=", 1)
        node = tree
        path = key.strip().split(".")
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r} conflicts with an earlier override of {part!r}")
        node[path[-1]] = raw
    return _apply(cfg, tree, "")


def _apply(cfg: Any, tree: dict[str, Any], prefix: str) -> Any:
    names = [f.name for f in dataclasses.fields(cfg)]
    hints = typing.get_type_hints(type(cfg))
    changes: dict[str, Any] = {}
    for name, sub in tree.items():
        full = f"{prefix}{name}"
        if name not in names:
            raise ValueError(f"unknown config key {full!r}: {type(cfg).__name__} has {sorted(names)}")
        current = getattr(cfg, name)
        if isinstance(sub, dict):
            if not dataclasses.is_dataclass(current):
                raise ValueError(f"config key {full!r}: {name} has no sub-fields")
            changes[name] = _apply(current, sub, f"{full}.")
        else:
            changes[name] = _coerce(sub, hints[name], full)
    return dataclasses.replace(cfg, **changes) if changes else cfg


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))


def load_config(path: Path) -> RunConfig:
    """Read a resolved config.json (a recipe's extended config when it has a `checkpoint`)."""
    data = json.loads(path.read_text())
    cls: type[RunConfig] = RunConfig
    if "checkpoint" in data:
        from dare.run_config_ext import RecipeRunConfig

        cls = RecipeRunConfig
    result: RunConfig = from_dict(cls, data)
    return result
