"""`dare show RECIPE` (and `dare train RECIPE --help`): every field of a recipe's resolved config,
with its value there and its doc, read from the `Attributes:` sections of the dataclass docstrings
(the algorithm's fields also from the `Flags` of `dllm_train.RLAlgorithm`)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any

from dare.config import KIND_NAMES, RLRecipeConfig, RunConfig, algorithm_fields, ordered_fields, set_by_run, to_dict

_HEADER = re.compile(r"^(Attributes|Flags)\b.*:$")
_ENTRY = re.compile(r"^([A-Za-z_][\w, ]*):\s*(.*)$")


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Field name -> its doc from the `Attributes:` / `Flags ...:` sections of the class docstrings
    (the class first, then its bases); `a, b: text` documents both."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for name, text in _parse(inspect.cleandoc(klass.__doc__ or "")).items():
            docs[name] = text
    return docs


def _parse(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    indent: int | None = None
    names: list[str] = []
    in_block = False
    for line in doc.splitlines():
        stripped, depth = line.strip(), len(line) - len(line.lstrip())
        if _HEADER.match(stripped) and depth == 0:
            in_block, indent, names = True, None, []
            continue
        if not in_block or not stripped:
            continue
        if indent is None:
            indent = depth
        if depth < indent:
            in_block = False
        elif depth == indent and (m := _ENTRY.match(stripped)):
            names = [n.strip() for n in m.group(1).split(",")]
            for name in names:
                out[name] = m.group(2)
        elif names:
            for name in names:
                out[name] = f"{out[name]} {stripped}"
    return out


def _value(value: Any) -> str:
    return json.dumps(to_dict(value))


STEP_DOCS: dict[str, dict[str, str]] = {
    "sft": {"trainer.max_steps": "not used by SFT recipes: their optimizer steps are sft.steps.",
            "sft.steps": "optimizer steps of the SFT phase (this recipe's step budget; trainer.max_steps is unused)."},
    "preference": {"trainer.max_steps": "optimizer steps of the preference phase (this recipe's step budget)."},
    "quickstart": {"sft.steps": "optimizer steps of the SFT warm start (first phase).",
                   "trainer.max_steps": "optimizer steps of the RL phase (second phase, after sft.steps of SFT)."},
}
"""Per run kind, the doc of the step-budget fields where the generic one would mislead (the
trainer's `max_steps` is documented for RL; SFT recipes count `sft.steps` instead)."""


def _lines(obj: Any, prefix: str, fields: list[dataclasses.Field[Any]], width: int,
           overrides: dict[str, str] | None = None) -> list[str]:
    docs = field_docs(type(obj))
    overrides = overrides or {}
    lines = []
    for f in fields:
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines += _lines(value, f"{prefix}{f.name}.", list(dataclasses.fields(value)), width, overrides)
        else:
            doc = overrides.get(f"{prefix}{f.name}") or docs.get(f.name) or f"({f.type if isinstance(f.type, str) else getattr(f.type, '__name__', f.type)})"
            lines.append(f"  {f'{prefix}{f.name} = {_value(value)}':{width}s}  {doc}".rstrip())
    return lines


def _default_sources(cfg: RunConfig) -> list[str]:
    """An RL recipe's algorithm defaults for its family, each with its source (docs/algorithms.md#dare-defaults)."""
    from dare.algorithms import RL_ENTRIES
    from dare.algorithms.defaults_table import source

    entry = RL_ENTRIES.get(cfg.algorithm_name) if isinstance(cfg, RLRecipeConfig) else None
    if entry is None or not isinstance(cfg, RLRecipeConfig):
        return []
    rows = {d.key: d for d in entry.defaults if d.applies_to(cfg.checkpoint.family)}  # a later row of a key wins
    if not rows:
        return []
    return ["", f"sources: the {cfg.algorithm_name} defaults of this recipe and where each value comes from",
            *(f"  {key}: {_value(d.value)}  {source(d)}" for key, d in rows.items())]


def _record_fields(cfg: RunConfig) -> list[str]:
    """The rollout record fields an RL recipe's algorithm reads (`RLAlgorithm.record_fields`)."""
    if not isinstance(cfg, RLRecipeConfig):
        return []
    from dllm_rollout import RECORD_VERSION

    fields = sorted(cfg.algorithm.record_fields)  # every RL entry holds a dllm_train.RLAlgorithm
    read = ", ".join(fields) if fields else "none beyond the tokens (prompt, response, masks, seeds)"
    return ["", f"rollout record (version {RECORD_VERSION}): {cfg.algorithm_name} reads {read}; a rollout.engine "
                "that does not fill one is refused before the policy loads (docs/generation.md#rollout-output)"]


def describe_config(cfg: RunConfig, summary: str = "") -> str:
    """Every field of `cfg` (`key = value  doc`), section by section, for `dare show`."""
    width = 44
    docs = field_docs(type(cfg))
    out = [f"recipe {cfg.recipe!r} ({KIND_NAMES[cfg.kind]}){': ' + summary if summary else ''}",
           "Every field with its value in this recipe; change one with KEY=VALUE (e.g. trainer.max_steps=10).", ""]
    for f in ordered_fields(cfg):
        value = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(value):
            out.append(f"{f'{f.name} = {_value(value)}':{width + 2}s}  {docs.get(f.name, '')}".rstrip())
            continue
        title = (inspect.cleandoc(type(value).__doc__ or "").splitlines() or [""])[0]
        fields = list(dataclasses.fields(value))
        if f.name == "algorithm":
            fields = algorithm_fields(value)
            homes = set_by_run(value)
            title = f"{cfg.algorithm_name}: {title}" + (
                f" ({', '.join(f'{k}: {v}' for k, v in homes.items())})" if homes else "")
        out += ["", f"{f.name}: {title}", *_lines(value, f"{f.name}.", fields, width, STEP_DOCS.get(cfg.kind))]
    return "\n".join(out + _record_fields(cfg) + _default_sources(cfg))


__all__ = ["STEP_DOCS", "describe_config", "field_docs"]
