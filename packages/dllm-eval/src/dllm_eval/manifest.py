"""Run manifests: everything needed to repeat or audit an evaluation run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import sys
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Sequence

import torch

__all__ = ["PACKAGES", "build_manifest", "hardware_info", "package_versions", "prompt_hash",
           "weights_hash"]

PACKAGES: tuple[str, ...] = (
    "dllm-eval", "dllm-models", "dllm-rollout", "torch", "transformers", "math-verify", "pyarrow",
)


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when absent)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def hardware_info() -> dict[str, Any]:
    """Host, CPU and accelerator description."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["cuda_devices"] = [torch.cuda.get_device_name(i)
                                for i in range(torch.cuda.device_count())]
        info["cuda_version"] = torch.version.cuda
    return info


def prompt_hash(prompts: Sequence[Sequence[int]], template: str | None = None) -> str:
    """SHA-256 over the chat template text (if any) and every rendered prompt's token ids."""
    h = hashlib.sha256()
    h.update((template or "").encode())
    for ids in prompts:
        h.update(json.dumps(list(ids)).encode())
        h.update(b"\n")
    return h.hexdigest()


def weights_hash(model: Any) -> str | None:
    """SHA-256 over parameter/buffer names, shapes, dtypes and bytes (None if not a module)."""
    if not isinstance(model, torch.nn.Module):
        return None
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        t = tensor.detach().to("cpu").contiguous()
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _model_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return repr(config)


def build_manifest(
    *,
    benchmark: str,
    preset: str,
    decoding: dict[str, Any],
    eos_handling: str,
    prompts: Sequence[Sequence[int]],
    chat_template: str | None,
    model: Any,
    seed: int | None,
    batch_size: int,
    limit: int | None,
    hash_weights: bool = True,
) -> dict[str, Any]:
    """The ``manifest.json`` content for one benchmark run (JSON-serialisable)."""
    return {
        "benchmark": benchmark,
        "preset": preset,
        "num_samples": len(prompts),
        "limit": limit,
        "batch_size": batch_size,
        "seed": seed,
        "prompt_template_hash": prompt_hash(prompts, chat_template),
        "decoding": decoding,
        "eos_handling": eos_handling,
        "model_class": type(model).__qualname__,
        "model_config": _model_config(model),
        "weights_sha256": weights_hash(model) if hash_weights else None,
        "packages": package_versions(),
        "hardware": hardware_info(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
