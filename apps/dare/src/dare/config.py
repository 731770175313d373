"""The run config: one frozen dataclass per kind of run, dotted overrides, and a JSON form for --config.

Each kind of run is its own class with the sections it requires (`KINDS`, `SECTIONS`): the quick
start (`QuickstartConfig`) its addition task, tiny model and both phases; a checkpoint recipe its
`checkpoint` folder, its `data` and the sections of its training phase (`RLRecipeConfig`:
`rl`/`rl_optim`, `SFTRecipeConfig`: `sft`/`sft_optim`, `PreferenceRecipeConfig`:
`preference`/`preference_optim`). The classes share their sections through small bases
(`RunConfig`, `CheckpointRun`, `RLPhaseRun`, `SFTPhaseRun`), and no section is ever None. The
`algorithm` section is the algorithm's own frozen dataclass (from `dllm_algorithms`, the registry
entry of `algorithm_name`), so `algorithm.mc_num=4` is an ordinary, validated dotted override.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from dare.algorithms import ALGORITHMS, PREFERENCE_ALGORITHMS, SFT_ALGORITHMS
from dare.config_sections import (
    CheckpointModelConfig,
    DataConfig,
    EvalConfig,
    PreferenceConfig,
    TinyModelConfig,
)
from dare.config_tree import apply_tree, coerce, did_you_mean, from_dict, parse_overrides, section_type
from dare.config_tree import to_dict as _tree_to_dict
from dare.tasks.addition import AdditionConfig
from dllm_models import KernelConfig, family_kind
from dllm_rollout import SamplingConfig
from dllm_train import OptimConfig, RLConfig, SFTConfig, TrainerConfig

SECTIONS: dict[str, tuple[str, ...]] = {
    "quickstart": ("task", "model", "sft", "sft_optim", "rl", "rl_optim", "eval"),
    "rl": ("checkpoint", "data", "rl", "rl_optim"),
    "sft": ("checkpoint", "data", "sft", "sft_optim"),
    "preference": ("checkpoint", "data", "preference", "preference_optim"),
}
"""Run kind -> the sections its class requires (`algorithm`, `rollout`, `kernels` and `trainer` belong to every run)."""

KIND_NAMES = {"quickstart": "the quick start", "rl": "an RL recipe", "sft": "an SFT recipe",
              "preference": "a preference recipe"}

SET_BY_RUN: dict[str, str] = {"sft": "sft.*", "lora": "checkpoint.lora_rank and checkpoint.lora_alpha"}
"""Algorithm fields that the run sets from its other sections, never keys of the `algorithm`
section: SFT's `sft` is the run's `sft` section itself (the one home of the SFT loss settings, as
for the quick start's warm start), `lora` the adapters of `checkpoint.lora_*` (as for RL recipes)."""


_TABLES: dict[str, dict[str, Any]] = {"rl": ALGORITHMS, "sft": SFT_ALGORITHMS, "preference": PREFERENCE_ALGORITHMS}
_TABLE_NAMES = {"rl": "RL algorithms", "sft": "SFT algorithms", "preference": "preference algorithms"}


def algorithm_kind(name: str, within: str | None = None) -> str:
    """'rl', 'sft' or 'preference': the table of the algorithm registry that holds `name`.

    Args:
        within: the kind of the run `name` is set on (None: unknown); an unknown name's error then
            suggests and lists only algorithms of that kind.
    """
    for kind, table in _TABLES.items():
        if name in table:
            return kind
    if within is not None:
        names = sorted(_TABLES[within])
        raise ValueError(f"algorithm {name!r} is unknown{did_you_mean(name, names)}; choose one of the "
                         f"{_TABLE_NAMES[within]} {names} (the kind of this run; see `dare recipes`)")
    names = sorted(n for table in _TABLES.values() for n in table)
    raise ValueError(f"algorithm {name!r} is unknown{did_you_mean(name, names)}; choose one of {names} "
                     "(see `dare recipes`)")


def registry_entry(name: str, within: str | None = None) -> Any:
    """The registry's default entry of algorithm `name` (any kind; `within`: see `algorithm_kind`)."""
    return _TABLES[algorithm_kind(name, within)][name]


def _sections_kind(data: dict[str, Any]) -> str | None:
    """The algorithm kind a run config's sections call for: 'rl' for the quick start (its second
    phase), else the kind whose own section (`rl`, `sft`, `preference`) `data` holds (None: none)."""
    if data.get("recipe", "quickstart") == "quickstart":
        return "rl"
    return next((kind for kind in ("rl", "preference", "sft") if isinstance(data.get(kind), dict)), None)


def algorithm_fields(entry: Any) -> list[dataclasses.Field[Any]]:
    """The fields of an algorithm entry that its config section holds (`SET_BY_RUN` ones excluded)."""
    return [f for f in dataclasses.fields(entry) if f.name not in SET_BY_RUN]


def set_by_run(entry: Any) -> dict[str, str]:
    """Field of `entry` -> where the run takes it from (`SET_BY_RUN`), for messages and `dare show`."""
    return {f.name: SET_BY_RUN[f.name] for f in dataclasses.fields(entry) if f.name in SET_BY_RUN}


FIELD_ORDER = ("recipe", "algorithm_name", "algorithm", "checkpoint", "data", "task", "model", "sft", "sft_optim",
               "rl", "rl_optim", "preference", "preference_optim", "rollout", "kernels", "eval", "trainer")
"""Every field a run config of some kind has, in the order of config errors and `dare show`."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What every `dare train` run has; each kind of run is a subclass with its own required sections
    (`QuickstartConfig`, `RLRecipeConfig`, `SFTRecipeConfig`, `PreferenceRecipeConfig`), written
    resolved to `config.json` in the output folder.

    Attributes:
        recipe: the recipe's name ("quickstart" or `<family>-<algorithm>`, see `dare recipes`).
        algorithm_name: the algorithm's registry name; `algorithm=NAME` on the command line is short
            for `algorithm_name=NAME` and resets the `algorithm` section to NAME's defaults.
        algorithm: the algorithm's hyper-parameters: its `dllm_algorithms` dataclass (clip
            constants, Monte-Carlo budget, iterations, ...); SFT's loss settings are `sft.*`
            (the SFT entry holds the run's `sft` section itself). Flags of the algorithm's math
            (`row_local`, `needs_old`, ...) are class constants, never keys.
        rollout: decoding of RL rollouts and of validation (lengths); `rollout.speed` says how the
            decoder runs (CUDA graphs, folded store passes, row retirement, fused sampling).
        kernels: how the model's forward runs (`dllm_models.KernelConfig`: fused elementwise
            kernels, the decode-attention kernel and its tuning, flex tiles), set on every model
            the run builds, on every rank. Never what is computed.
        trainer: the outer loop: steps, seed, periods, backend, memory levers, metric sinks.
    """

    KIND: ClassVar[str] = ""
    recipe: str
    algorithm_name: str
    algorithm: Any = None  # None: the registry's entry of `algorithm_name`, set in __post_init__
    rollout: SamplingConfig = field(
        default_factory=lambda: SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0)
    )
    kernels: KernelConfig = field(default_factory=KernelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    @property
    def kind(self) -> str:
        """'quickstart', 'rl', 'sft' or 'preference' (a recipe's kind is its algorithm's)."""
        return self.KIND

    @property
    def family(self) -> str:
        """The model family the run trains (each kind says which)."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        if self.KIND not in SECTIONS:
            raise TypeError(f"{type(self).__name__} is no kind of run; build one of {[c.__name__ for c in KINDS.values()]}")
        entry = registry_entry(self.algorithm_name)
        kind = check_kind(self.recipe, self.algorithm_name, SECTIONS[self.KIND], self._example_family())
        assert kind == self.KIND, (kind, self.KIND)  # check_kind raised otherwise: the sections differ
        if self.algorithm is None:
            object.__setattr__(self, "algorithm", entry)
        elif type(self.algorithm) is not type(entry):
            raise ValueError(f"the algorithm section is a {type(self.algorithm).__name__}, but algorithm_name="
                             f"{self.algorithm_name!r} is a {type(entry).__name__}")
        if self.family not in entry.families:
            raise ValueError(f"algorithm {self.algorithm_name!r} is defined for {list(entry.families)}, "
                             f"not family {self.family!r}")

    def _example_family(self) -> str | None:
        """The family of the example recipe in a wrong-kind error (None: no example)."""
        return None


@dataclass(frozen=True, kw_only=True)
class CheckpointRun(RunConfig):
    """A run on a released checkpoint (every recipe but the quick start).

    Attributes:
        checkpoint: the released model folder (checkpoint recipes).
        data: training and validation data (checkpoint recipes).
    """

    checkpoint: CheckpointModelConfig = field(default_factory=CheckpointModelConfig)
    data: DataConfig = field(default_factory=DataConfig)

    @property
    def family(self) -> str:
        """The checkpoint's model family."""
        return self.checkpoint.family

    def _example_family(self) -> str | None:
        return self.checkpoint.family


@dataclass(frozen=True, kw_only=True)
class RLPhaseRun(RunConfig):
    """A run with an RL phase (the quick start's second phase, RL recipes).

    Attributes:
        rl: batch shape of an RL step (quick start, RL recipes).
        rl_optim: the RL phase's optimizer.
    """

    rl: RLConfig = field(default_factory=RLConfig)
    rl_optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_policy_gradient(self.algorithm, self.rollout, self.algorithm_name)
        check_denoising_steps(self.rollout, family_kind(self.family))
        check_value_model(self.algorithm, self.trainer.backend, self.algorithm_name,
                          lora_rank=getattr(getattr(self, "checkpoint", None), "lora_rank", 0))


@dataclass(frozen=True, kw_only=True)
class SFTPhaseRun(RunConfig):
    """A run with an SFT phase (the quick start's warm start, SFT recipes).

    Attributes:
        sft: the SFT phase: steps, batch size and loss settings (quick start warm start, SFT recipes).
        sft_optim: the SFT phase's optimizer.
    """

    sft: SFTConfig = field(default_factory=SFTConfig)
    sft_optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass(frozen=True, kw_only=True)
class QuickstartConfig(RLPhaseRun, SFTPhaseRun):
    """The quick start: a tiny model built from scratch on the addition task, SFT warm start, then RL.

    Attributes:
        task: the addition task (quick start).
        model: the tiny model built from scratch (quick start).
        eval: held-out evaluation of the quick start.
    """

    KIND: ClassVar[str] = "quickstart"
    recipe: str = "quickstart"
    algorithm_name: str = "d1"
    task: AdditionConfig = field(default_factory=AdditionConfig)
    model: TinyModelConfig = field(default_factory=TinyModelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def family(self) -> str:
        """'llada': the tiny model is LLaDA-architecture."""
        return "llada"


@dataclass(frozen=True, kw_only=True)
class RLRecipeConfig(CheckpointRun, RLPhaseRun):
    """An RL recipe: RL algorithm `algorithm_name` on a released checkpoint and RL parquet prompts."""

    KIND: ClassVar[str] = "rl"


@dataclass(frozen=True, kw_only=True)
class SFTRecipeConfig(CheckpointRun, SFTPhaseRun):
    """An SFT recipe: diffusion SFT of a released checkpoint on prompt/response pairs."""

    KIND: ClassVar[str] = "sft"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "algorithm", _sft_entry(self, registry_entry(self.algorithm_name)))


@dataclass(frozen=True, kw_only=True)
class PreferenceRecipeConfig(CheckpointRun):
    """A preference recipe: DPO-style training of a released checkpoint on chosen/rejected pairs.

    Attributes:
        preference: batch shape of a preference step (preference recipes; steps: trainer.max_steps).
        preference_optim: the preference phase's optimizer.
    """

    KIND: ClassVar[str] = "preference"
    preference: PreferenceConfig = field(default_factory=PreferenceConfig)
    preference_optim: OptimConfig = field(default_factory=OptimConfig)


KINDS: dict[str, type[RunConfig]] = {"quickstart": QuickstartConfig, "rl": RLRecipeConfig, "sft": SFTRecipeConfig,
                                     "preference": PreferenceRecipeConfig}
"""Run kind -> its config class (`SECTIONS`: the sections of each)."""

RLRun = QuickstartConfig | RLRecipeConfig
"""A run whose RL phase `dare.rl_backend` builds."""


def run_kind(recipe: str, algorithm_name: str) -> str:
    """The kind of a run: 'quickstart' for the quick start, else its algorithm's (`algorithm_kind`)."""
    return "quickstart" if recipe == "quickstart" else algorithm_kind(algorithm_name)


def check_kind(recipe: str, name: str, present: Sequence[str], family: str | None) -> str:
    """The kind of a run of `recipe` with algorithm `name`; raises if it is not the kind of the
    sections `present` (an `algorithm=NAME` of another kind, a quick start with a non-RL algorithm).

    Args:
        family: the checkpoint's family, for the example recipe of the error (None: none).
    """
    kind = run_kind(recipe, name)
    if kind == "quickstart" and name not in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is not an RL algorithm; the quick start's second "
                         f"phase is RL: choose one of {sorted(ALGORITHMS)}, or a checkpoint recipe (`dare recipes`)")
    extra = [n for n in _OPTIONAL if n not in SECTIONS[kind] and n in present]
    if extra:
        example = f" such as {family}-{name}" if family is not None else ""
        raise ValueError(
            f"recipe {recipe!r} with algorithm {name!r} is {KIND_NAMES[kind]}, which has the "
            f"sections {', '.join(SECTIONS[kind])} (and algorithm, rollout, trainer), not {', '.join(extra)}. "
            f"algorithm=NAME does not switch the kind of a recipe: start from a {kind} recipe{example} "
            "(`dare recipes` lists them)")
    return kind


def check_policy_gradient(algorithm: Any, rollout: SamplingConfig, name: str) -> None:
    """Raise if RL `algorithm` would train with an identically zero policy gradient under `rollout`.

    An algorithm that learns only from differences between the samples of a group
    (`needs_distinct_samples`: group-relative advantages or weights) gets none when decoding is
    deterministic (`SamplingConfig.deterministic`: temperature 0 with confidence-ordered commits),
    since every sample of a group is then the same response with the same reward.
    """
    if not algorithm.zero_gradient_under(rollout):
        return
    raise ValueError(
        f"rollout.temperature={rollout.temperature} with remasking {rollout.remasking!r} decodes every sample "
        f"of a prompt's group to the same response, so algorithm {name!r} ({algorithm.label}), which learns from "
        "the differences within a group, would train with a policy gradient of exactly 0 (loss 0, grad norm 0 "
        "every step). Set rollout.temperature > 0 (the recipes use 0.2-1.0)")


def check_value_model(algorithm: Any, backend: str, name: str, *, lora_rank: int = 0) -> None:
    """Raise if RL `algorithm` trains a value model (`critic`) where none can run: the value model
    (`dllm_train.critic.ValueWorker`, a full copy of the policy) runs on the local backend only, and
    not beside LoRA adapters."""
    if getattr(algorithm, "critic", None) is None:
        return
    if backend != "local":
        raise ValueError(
            f"algorithm {name!r} ({algorithm.label}) trains a value model, which runs on trainer.backend='local' "
            f"only, not trainer.backend={backend!r}: set trainer.backend=local (or algorithm.value_model=false)")
    if lora_rank:
        raise ValueError(
            f"algorithm {name!r} ({algorithm.label}) trains a value model, a full copy of the policy, which "
            f"checkpoint.lora_rank={lora_rank} (LoRA adapters) does not cover: set checkpoint.lora_rank=0 "
            "(or algorithm.value_model=false)")


def check_denoising_steps(rollout: SamplingConfig, kind: str) -> None:
    """Raise if the rollout has more denoising steps than tokens to unmask: `rollout.steps` >
    `rollout.max_new_tokens` (masked diffusion, where steps count for the whole response), or >
    `rollout.block_length` (block diffusion, where they count per block). Each extra step is a full
    forward that unmasks nothing, so shortening responses (`rollout.max_new_tokens=16` on a recipe
    of 256 steps) must lower the steps too, not keep the recipe's silently."""
    per, tokens, what = ((rollout.steps, rollout.block_length, "rollout.block_length") if kind == "block"
                         else (rollout.steps, rollout.max_new_tokens, "rollout.max_new_tokens"))
    if per > tokens:
        raise ValueError(f"rollout.steps={per} exceeds {what}={tokens}: each step beyond one per token is a "
                         f"forward that unmasks nothing; set rollout.steps={tokens} (one token per step) or fewer")


_OPTIONAL = tuple(dict.fromkeys(n for names in SECTIONS.values() for n in names))


def ordered_fields(cfg: RunConfig) -> list[dataclasses.Field[Any]]:
    """The dataclass fields of `cfg` in `FIELD_ORDER`."""
    return sorted(dataclasses.fields(cfg), key=lambda f: FIELD_ORDER.index(f.name))


def sections(cfg: RunConfig) -> list[str]:
    """The names of the sections (dataclass fields) the run has."""
    return [f.name for f in ordered_fields(cfg)
            if dataclasses.is_dataclass(getattr(cfg, f.name)) and f.name not in ("recipe", "algorithm_name")]


def _all_hints() -> dict[str, Any]:
    """Field name -> type hint over every kind, in `FIELD_ORDER`."""
    hints: dict[str, Any] = {}
    for cls in KINDS.values():
        hints.update(typing.get_type_hints(cls))
    return {name: hints[name] for name in FIELD_ORDER}


def _sft_entry(cfg: SFTRecipeConfig, entry: Any) -> Any:
    """The SFT entry holding the run's `sft` section (its loss settings) and the adapters of `checkpoint.lora_*`."""
    ckpt, sft = cfg.checkpoint, cfg.sft
    if entry.lora is not None and ckpt.lora_rank < 1:
        raise ValueError(f"algorithm {cfg.algorithm_name!r} trains LoRA adapters but checkpoint.lora_rank="
                         f"{ckpt.lora_rank}; set checkpoint.lora_rank=16 (or another rank >= 1), "
                         "or use algorithm sft for full fine-tuning")
    return dataclasses.replace(cfg.algorithm, sft=sft, lora=ckpt.lora())


def to_dict(cfg: Any) -> Any:
    """A JSON-ready dict of a config: a RunConfig with the sections of its kind, its algorithm section
    without the fields the run sets from other sections (`SET_BY_RUN`)."""
    if not isinstance(cfg, RunConfig):
        return _tree_to_dict(cfg)
    out = {f.name: _tree_to_dict(getattr(cfg, f.name)) for f in ordered_fields(cfg)}
    out["algorithm"] = _tree_to_dict(cfg.algorithm, algorithm_fields(cfg.algorithm))
    return out


def run_config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a run config from `to_dict` output: the class of its kind (`KINDS`, read from its
    recipe and algorithm names), validated again; absent sections get their defaults."""
    data = dict(data)
    if isinstance(data.get("algorithm"), str) and "algorithm_name" not in data:  # config.json of dare <= 0.2
        data["algorithm_name"] = data.pop("algorithm")
    name = str(data.get("algorithm_name", QuickstartConfig.algorithm_name))
    entry = registry_entry(name, _sections_kind(data))
    hints = _all_hints()
    names = list(FIELD_ORDER)
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"unknown config keys {unknown}{did_you_mean(unknown[0], names)}: the run config "
                         f"has {names}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "algorithm":
            _check_set_by_run(entry, value)
            kwargs[key] = from_dict(type(entry), value, prefix="algorithm.", base=entry,
                                    fields=algorithm_fields(entry))
        elif (cls := section_type(hints[key])) is not None and isinstance(value, dict):
            kwargs[key] = from_dict(cls, value, prefix=f"{key}.")
        else:
            kwargs[key] = coerce(value, hints[key], key)
    kwargs.setdefault("recipe", QuickstartConfig.recipe)
    kwargs.setdefault("algorithm_name", name)
    recipe = str(kwargs["recipe"])
    ckpt = kwargs.get("checkpoint")
    kind = check_kind(recipe, name, list(kwargs), ckpt.family if isinstance(ckpt, CheckpointModelConfig) else None)
    return KINDS[kind](**kwargs)


def _check_set_by_run(entry: Any, keys: Any) -> None:
    """Raise for an `algorithm.KEY` that the run sets from another section: a `SET_BY_RUN` field, or
    a field of a section the entry holds (SFT's `algorithm.normalizer` is `sft.normalizer`)."""
    bound = set_by_run(entry)
    held = {f.name: f"{name}.{f.name}" for name in bound if dataclasses.is_dataclass(value := getattr(entry, name))
            for f in dataclasses.fields(value)}
    for key in keys:
        home = bound.get(key) or held.get(key)
        if home is not None:
            raise ValueError(f"config key 'algorithm.{key}': a run takes {key} from {home}; set {home} instead")


C = TypeVar("C", bound=RunConfig)


def apply_overrides(cfg: C, overrides: list[str]) -> C:
    """Apply `a.b.c=value` overrides to a run config (of any kind; the result is of the same kind).

    Overrides of the same component are applied together, so fields validated against each
    other (e.g. `rollout.max_new_tokens` and `rollout.block_length`) can change in one command.
    `algorithm=NAME` is short for `algorithm_name=NAME`, which resets the algorithm section to
    NAME's defaults before `algorithm.*` overrides apply.

    Raises:
        ValueError: naming the key and the valid keys when a path does not exist, the section and
            the run's kind when the run has no such section, or the field and value when invalid.
    """
    tree = parse_overrides([f"algorithm_name={o.split('=', 1)[1]}" if o.split("=", 1)[0].strip() == "algorithm"
                            else o for o in overrides])
    changes: dict[str, Any] = {}
    entry, name = cfg.algorithm, cfg.algorithm_name
    if "algorithm_name" in tree:
        name = str(tree.pop("algorithm_name"))
        entry = changes["algorithm"] = registry_entry(name, "rl" if cfg.KIND == "quickstart" else cfg.KIND)
        changes["algorithm_name"] = name
    if "algorithm" in tree:
        _check_set_by_run(entry, tree["algorithm"])
        changes["algorithm"] = apply_tree(entry, tree.pop("algorithm"), "algorithm.", label=f"algorithm {name!r}",
                                          fields=algorithm_fields(entry))
    hints = _all_hints()
    for key, sub in tree.items():
        if key not in hints:
            raise ValueError(f"unknown config key {key!r}{did_you_mean(key, hints)}: the run config has "
                             f"{sorted(hints)}")
        current: Any = getattr(cfg, key, None)  # None: a section of another kind
        cls = section_type(hints[key])
        if cls is not None and current is None:
            full = f"{key}.{next(iter(sub))}" if isinstance(sub, dict) else key
            raise ValueError(f"config key {full!r}: recipe "
                             f"{cfg.recipe!r} is {KIND_NAMES[cfg.kind]}, which has no {key!r} section; its sections "
                             f"are {', '.join(sections(cfg))}")
        if isinstance(sub, dict):
            if cls is None:
                raise ValueError(f"config key {key!r} has no sub-fields")
            changes[key] = apply_tree(current, sub, f"{key}.")
        elif cls is not None:
            raise ValueError(f"config key {key!r} is a section; set its fields, e.g. {key}."
                             f"{dataclasses.fields(current)[0].name}=...")
        else:
            changes[key] = coerce(sub, hints[key], key)
    return dataclasses.replace(cfg, **changes) if changes else cfg


def save_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))


def load_config(path: Path) -> RunConfig:
    """Read a resolved config.json (any recipe)."""
    return run_config_from_dict(json.loads(path.read_text()))


__all__ = [
    "FIELD_ORDER", "SET_BY_RUN", "KINDS", "SECTIONS", "CheckpointModelConfig", "CheckpointRun", "DataConfig", "EvalConfig",
    "PreferenceConfig", "PreferenceRecipeConfig", "QuickstartConfig", "RLPhaseRun", "RLRecipeConfig", "RLRun",
    "RunConfig", "SFTPhaseRun", "SFTRecipeConfig", "TinyModelConfig", "algorithm_fields", "algorithm_kind",
    "apply_overrides", "check_denoising_steps", "check_kind", "load_config", "ordered_fields", "registry_entry", "run_config_from_dict",
    "run_kind", "save_config", "sections", "set_by_run", "to_dict",
]
