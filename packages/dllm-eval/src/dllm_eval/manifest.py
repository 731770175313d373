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

__all__ = ["FINGERPRINT_METHOD", "PACKAGES", "build_manifest", "hardware_info", "package_versions",
           "prompt_hash", "weights_fingerprint", "weights_hash"]

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
    """SHA-256 over parameter/buffer names, shapes, dtypes and bytes (None if not a module).

    Copies every tensor to the CPU: slow for large models; manifests use :func:`weights_fingerprint`.
    """
    if not isinstance(model, torch.nn.Module):
        return None
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        t = tensor.detach().to("cpu").contiguous()
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


FINGERPRINT_METHOD = "mix32-v1"
"""Name of the :func:`weights_fingerprint` scheme, stored with it so a later scheme cannot be
mistaken for it."""

_SEED_MUL = 0x2545F491  # odd multipliers below 2**31 (int32 scalars)
_MIX_MULS = (0x7FEB352D, 0x68E31DA5)
_CHUNK_WORDS = {"cpu": 1 << 18, "cuda": 1 << 26}  # CPU: chunks that stay in cache; GPU: few launches
_WORD_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}


def _int32(value: int) -> int:
    """`value` mod 2**32 as a signed 32-bit integer."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integer words of its item size (8-byte items as two 32-bit words),
    flat, on its device, without a copy (a view of the same storage)."""
    flat = tensor.detach().contiguous().reshape(-1)
    view = _WORD_VIEW.get(flat.element_size())
    if view is None:
        raise TypeError(f"cannot fingerprint a tensor of dtype {tensor.dtype}")
    return flat.view(view)


def _lane_sums(words: torch.Tensor) -> list[int]:
    """Two sums over the words w_j (as int32) at positions j: m1_j = (w_j ^ s_j) * A and
    m2_j = (m1_j ^ s_j) * B in int32 arithmetic (mod 2**32), each summed in int64 (mod 2**64),
    with per-position seeds s_j = j * S (mod 2**32).

    Each step (xor, multiplication by an odd constant mod 2**32) is a bijection of 32-bit words,
    so changing one word always changes both sums. The arithmetic is exact and the sums do not
    depend on the order of addition, so every device and chunk length (`_CHUNK_WORDS`) gives
    the same result.
    """
    device = words.device
    size = _CHUNK_WORDS.get(device.type, 1 << 26)
    n = words.numel()
    base = torch.arange(min(n, size), dtype=torch.int32, device=device) * _SEED_MUL
    buf, seeds = torch.empty_like(base), torch.empty_like(base)
    sums = torch.zeros(2, dtype=torch.int64, device=device)
    for start in range(0, n, size):
        part = words[start:start + size]
        m, s = buf[:part.numel()], seeds[:part.numel()]
        torch.add(base[:part.numel()], _int32(start * _SEED_MUL), out=s)
        m.copy_(part)  # int16 / uint8 words widen to int32 (injective)
        m ^= s
        m *= _MIX_MULS[0]
        sums[0] += m.sum(dtype=torch.int64)
        m ^= s
        m *= _MIX_MULS[1]
        sums[1] += m.sum(dtype=torch.int64)
    return [int(v) for v in sums.tolist()]


def weights_fingerprint(model: Any) -> str | None:
    """A fingerprint of a module's parameters and buffers, computed on their own device.

    Per tensor (sorted by name): its name, shape, dtype and two integer sums of mixed 32-bit
    words of its bytes (`_lane_sums`); SHA-256 over all of it, prefixed by
    :data:`FINGERPRINT_METHOD`. Changing any single value changes the fingerprint (the mix is a
    bijection per position); two unrelated weight sets almost surely differ (each sum is a sum of
    pseudo-random 32-bit values). The arithmetic is exact integer arithmetic, so the same weights
    give the same fingerprint on CPU and GPU; the same values in another dtype give another one
    (their bytes differ). No tensor leaves its device: only two integers per tensor are read back.

    Args:
        model: a `torch.nn.Module` (anything else gives None).

    Returns:
        `"mix32-v1:<64 hex digits>"`, or None when `model` is not a module.
    """
    if not isinstance(model, torch.nn.Module):
        return None
    h = hashlib.sha256(FINGERPRINT_METHOD.encode())
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            sums = _lane_sums(_words(tensor)) if tensor.numel() else [0, 0]
            h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{sums}\n".encode())
    return f"{FINGERPRINT_METHOD}:{h.hexdigest()}"


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


def _kernels(model: Any) -> Any:
    """The model's `KernelConfig` (how its forward ran: kernels and their tuning) as a dict, or None."""
    kernels = getattr(model, "kernels", None)
    if dataclasses.is_dataclass(kernels) and not isinstance(kernels, type):
        return dataclasses.asdict(kernels)
    return None


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
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """The ``manifest.json`` content for one benchmark run (JSON-serialisable).

    ``decoding`` holds the sampling settings with their ``speed`` section (how the decoder ran);
    ``kernels`` is the model's ``KernelConfig`` (how its forward ran), so the folder describes the run.

    ``weights_fingerprint`` is ``fingerprint`` when given (taken once per model by the caller),
    else :func:`weights_fingerprint` of ``model`` when ``hash_weights``, else None.
    """
    if fingerprint is None and hash_weights:
        fingerprint = weights_fingerprint(model)
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
        "kernels": _kernels(model),
        "weights_fingerprint": fingerprint,
        "packages": package_versions(),
        "hardware": hardware_info(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
