"""Nested frozen dataclasses as trees: their JSON form, typed reading of strings, dotted overrides.

Generic over any dataclass; `dare.config` adds what is particular to the run config (sections
that exist per kind of run, the algorithm section whose class follows the algorithm's name).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Collection, Sequence
from typing import Any


RENAMED = {"num_replicates": "mc_num"}
"""Config keys renamed for one spelling per concept: old name -> new name (DMPO's masks per sequence)."""


def did_you_mean(word: str, choices: Collection[str], prefix: str = "") -> str:
    """The hint ` (did you mean 'x'?)` for the closest of `choices` to `word` (difflib), else "";
    the suggestion is written with `prefix` before it (a dotted key's section). A renamed key
    (`RENAMED`) names its new spelling."""
    if RENAMED.get(word) in choices:
        return f" (renamed: use {prefix + RENAMED[word]!r})"
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {prefix + close[0]!r}?)" if close else ""


def section_type(hint: Any) -> type[Any] | None:
    """The dataclass of a field's type hint (`X` or `X | None`), or None for a plain value."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        classes = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a) and isinstance(a, type)]
        return classes[0] if len(classes) == 1 else None
    return None


def to_dict(cfg: Any, fields: Sequence[dataclasses.Field[Any]] | None = None) -> Any:
    """A JSON-ready dict of a (nested) dataclass config (tuples become lists); `fields`: a subset."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in (fields or dataclasses.fields(cfg))}
    if isinstance(cfg, tuple):
        return [to_dict(v) for v in cfg]
    return cfg


class KeyedError(ValueError):
    """A section's validation error whose field names are already the user's dotted keys."""


def keyed(err: ValueError, cls: type[Any], prefix: str) -> ValueError:
    """`err` of validating dataclass `cls` with its fields named as the user typed them, `prefix`
    + field: at the start of the message, and before `=` or ` (` (a library's own label such as
    `optim.` for `rl_optim.` is replaced). `rollout.steps=0` gives "rollout.steps must be >= 1",
    not "steps must be >= 1"."""
    if isinstance(err, KeyedError) or not prefix:
        return err
    names = "|".join(sorted((re.escape(f.name) for f in dataclasses.fields(cls)), key=len, reverse=True))
    pattern = re.compile(rf"(^|(?<=[\s(`'\"]))(?:[a-z_]+\.)*({names})(?=$|=| \(| must| is| unknown|:|,)")
    return KeyedError(pattern.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)}", str(err)))


def _built(cls: type[Any], prefix: str, make: Any) -> Any:
    """`make()` (a constructor or `dataclasses.replace` of `cls`), its ValueError `keyed`."""
    try:
        return make()
    except KeyedError:
        raise
    except ValueError as err:
        raise keyed(err, cls, prefix) from None


def from_dict(cls: type[Any], data: dict[str, Any], *, prefix: str = "", base: Any = None,
              fields: Sequence[dataclasses.Field[Any]] | None = None) -> Any:
    """Rebuild a config dataclass from `to_dict` output (validation runs again).

    Keys absent from `data` keep `base`'s values (None: the class defaults); `fields` limits the
    keys accepted. Raises ValueError naming unknown keys and the valid ones.
    """
    fields = fields if fields is not None else dataclasses.fields(cls)
    names = [f.name for f in fields]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"unknown config keys {[prefix + k for k in unknown]}"
                         f"{did_you_mean(unknown[0], names, prefix)}: "
                         f"{prefix.rstrip('.') or cls.__name__} has {sorted(names)}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name in names:
        if name not in data:
            continue
        value, hint = data[name], hints[name]
        sub = section_type(hint)
        if sub is not None and isinstance(value, dict):
            kwargs[name] = from_dict(sub, value, prefix=f"{prefix}{name}.")
        else:
            kwargs[name] = coerce(value, hint, prefix + name)
    return _built(cls, prefix, lambda: dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs))


def coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert a parsed override or JSON value to the field's type (ValueError naming the field)."""
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
                return coerce(value, arg, name)
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{name}: cannot read {value!r} as {_type_name(hint)}")
    if origin is tuple:
        try:
            items = json.loads(value) if isinstance(value, str) else value
        except json.JSONDecodeError:
            raise ValueError(f"{name}: expected a list such as [0.9, 0.95], got {value!r}") from None
        if not isinstance(items, (list, tuple)) or (... not in args and len(items) != len(args)):
            raise ValueError(f"{name}: expected a list of {len(args)} items, got {value!r}")
        kinds = [args[0]] * len(items) if ... in args else list(args)
        return tuple(coerce(v, a, name) for v, a in zip(items, kinds))
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
        if isinstance(value, bool):
            raise ValueError(f"{name}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if hint is str:
        if isinstance(value, (dict, list)):
            raise ValueError(f"{name}: expected a string, got {value!r}")
        return str(value)
    return value


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """`["a.b=1", "a.c=x"]` -> `{"a": {"b": "1", "c": "x"}}` (values stay strings)."""
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
        if isinstance(node.get(path[-1]), dict):
            raise ValueError(f"override {item!r} sets {key.strip()!r}, whose fields are overridden too")
        node[path[-1]] = raw
    return tree


def apply_tree(cfg: Any, tree: dict[str, Any], prefix: str, *, label: str | None = None,
               fields: Sequence[dataclasses.Field[Any]] | None = None) -> Any:
    """`cfg` with the values of `tree` (a `parse_overrides` result) applied, validated together.

    `label` names the dataclass in errors (default: its class name); `fields` limits the keys.
    """
    names = [f.name for f in (fields if fields is not None else dataclasses.fields(cfg))]
    hints = typing.get_type_hints(type(cfg))
    changes: dict[str, Any] = {}
    for name, sub in tree.items():
        full = f"{prefix}{name}"
        if name not in names:
            raise ValueError(f"unknown config key {full!r}{did_you_mean(name, names, prefix)}: "
                             f"{label or type(cfg).__name__} has {sorted(names)}")
        current = getattr(cfg, name)
        if isinstance(sub, dict):
            if not dataclasses.is_dataclass(current):
                raise ValueError(f"config key {full!r}: {name} has no sub-fields")
            changes[name] = apply_tree(current, sub, f"{full}.")
        elif dataclasses.is_dataclass(current):
            raise ValueError(f"config key {full!r} is a section; set its fields, e.g. {full}."
                             f"{dataclasses.fields(current)[0].name}=...")
        else:
            changes[name] = coerce(sub, hints[name], full)
    return _built(type(cfg), prefix, lambda: dataclasses.replace(cfg, **changes)) if changes else cfg


__all__ = ["KeyedError", "apply_tree", "coerce", "did_you_mean", "from_dict", "parse_overrides",
           "keyed", "section_type", "to_dict"]
