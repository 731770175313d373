"""A family's config.json I/O: its frozen config dataclass from and to the checkpoint's dict."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, TypeVar, cast

C = TypeVar("C")


def config_from_hf(cls: type[C], raw: dict[str, Any], renames: dict[str, str] | None = None) -> C:
    """Build a frozen config dataclass from a config.json dict; unknown keys go to `extra`.

    Args:
        cls: the family's config dataclass (with an `extra` field).
        raw: the config.json dict.
        renames: dataclass field -> config.json key, where the two differ.
    """
    renames = renames or {}
    names = {f.name for f in fields(cast(Any, cls)) if f.name != "extra"}
    kwargs: dict[str, Any] = {}
    used: set[str] = set()
    for name in names:
        key = renames.get(name, name)
        if key in raw and raw[key] is not None:
            kwargs[name] = raw[key]
            used.add(key)
    extra = {k: v for k, v in raw.items() if k not in used}
    factory: Any = cls
    return cast(C, factory(**kwargs, extra=extra))


def config_to_hf(cfg: Any, defaults: dict[str, Any], renames: dict[str, str] | None = None) -> dict[str, Any]:
    """The config.json dict of a config dataclass: `extra` keys, then the fields, then defaults."""
    renames = renames or {}
    out = dict(cfg.extra)
    out.update({renames.get(k, k): v for k, v in asdict(cfg).items() if k != "extra"})
    for k, v in defaults.items():
        out.setdefault(k, v)
    return out


__all__ = ["config_from_hf", "config_to_hf"]
