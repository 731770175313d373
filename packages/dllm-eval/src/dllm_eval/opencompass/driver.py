"""Drive an OpenCompass evaluation from the main environment (standard library only).

OpenCompass lives in the separate uv project ``envs/opencompass`` (its numpy<2 pin breaks the
main environment); :func:`run_opencompass` runs ``python -m dllm_eval.opencompass.run`` there
through ``uv run --project``, offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["DECODING_FLAGS", "OFFLINE_ENV", "PROJECT_ENV_VAR", "build_command", "find_project", "run_opencompass"]

PROJECT_ENV_VAR = "DARE_OPENCOMPASS_PROJECT"
"""Environment variable naming the OpenCompass uv project folder (overrides the search)."""

OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_EVALUATE_OFFLINE": "1",
    "UV_PYTHON_DOWNLOADS": "never",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Set in the child's environment: the ``HF_*``/``TRANSFORMERS_*`` offline switches always, the
others unless already set."""

DECODING_FLAGS = ("max_new_tokens", "steps", "block_length", "temperature", "remasking",
                  "cache", "threshold")
"""The SamplingConfig fields ``python -m dllm_eval.opencompass.run`` takes as flags (``--max-new-tokens``, ...)."""


def find_project(start: str | os.PathLike[str] | None = None) -> Path:
    """The ``envs/opencompass`` project folder.

    ``$DARE_OPENCOMPASS_PROJECT`` if set, else the first ``envs/opencompass/pyproject.toml``
    found walking up from ``start`` (default: this file, i.e. the repository checkout of an
    editable install), then from the current directory.
    """
    env = os.environ.get(PROJECT_ENV_VAR)
    if env:
        path = Path(env).resolve()
        if not (path / "pyproject.toml").is_file():
            raise FileNotFoundError(f"${PROJECT_ENV_VAR}={env} has no pyproject.toml")
        return path
    starts = [Path(start)] if start is not None else [Path(__file__), Path.cwd()]
    for s in starts:
        for parent in [s.resolve(), *s.resolve().parents]:
            candidate = parent / "envs" / "opencompass"
            if (candidate / "pyproject.toml").is_file():
                return candidate
    raise FileNotFoundError(
        "envs/opencompass/pyproject.toml not found above "
        f"{', '.join(str(s) for s in starts)}; set ${PROJECT_ENV_VAR} to the project folder")


def build_command(
    checkpoint: str | os.PathLike[str],
    benchmarks: Sequence[str],
    *,
    preset: str | Sequence[str] = "dare_local",
    limit: int | None = None,
    output_dir: str | os.PathLike[str],
    batch_size: int | None = None,
    seed: int | None = None,
    device: str | None = None,
    decoding: Mapping[str, Any] | None = None,
    hash_weights: bool = True,
    project: str | os.PathLike[str] | None = None,
    locked: bool = False,
    uv: str = "uv",
) -> list[str]:
    """The ``uv run --project ... python -m dllm_eval.opencompass.run ...`` command line."""
    if isinstance(benchmarks, str):
        benchmarks = [benchmarks]
    presets = [preset] if isinstance(preset, str) else list(preset)
    proj = Path(project).resolve() if project is not None else find_project()
    cmd = [uv, "run", "--project", str(proj), "--no-dev"]
    if locked:
        cmd.append("--locked")
    cmd += ["python", "-m", "dllm_eval.opencompass.run",
            "--checkpoint", str(Path(checkpoint).resolve()),
            "--benchmarks", *benchmarks, "--preset", *presets,
            "--output-dir", str(Path(output_dir).resolve())]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if device is not None:
        cmd += ["--device", device]
    if not hash_weights:
        cmd.append("--no-hash-weights")
    for key, value in (decoding or {}).items():
        if key not in DECODING_FLAGS:
            raise ValueError(f"unknown decoding override {key!r}; valid: {list(DECODING_FLAGS)}")
        if value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def run_opencompass(
    checkpoint: str | os.PathLike[str],
    benchmarks: Sequence[str],
    *,
    preset: str | Sequence[str] = "dare_local",
    limit: int | None = None,
    output_dir: str | os.PathLike[str],
    batch_size: int | None = None,
    seed: int | None = None,
    device: str | None = None,
    decoding: Mapping[str, Any] | None = None,
    hash_weights: bool = True,
    project: str | os.PathLike[str] | None = None,
    locked: bool = False,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> int:
    """Evaluate ``checkpoint`` on ``benchmarks`` with OpenCompass; returns the exit code.

    Runs ``uv run --project <repo>/envs/opencompass python -m dllm_eval.opencompass.run``
    (uv syncs that environment on first use) fully offline. Outputs land in ``output_dir``:
    ``results.md``, ``results.json``, ``manifest.json``, the generated ``config.py`` and
    OpenCompass's own folder ``opencompass/<timestamp>/``.

    Args:
        checkpoint: checkpoint folder (config.json + safetensors + tokenizer).
        benchmarks: ``dllm_eval`` benchmark names (``gsm8k``, ``math500``, ``mbpp``, ...).
        preset: preset name(s) (``dare_local``, ``d1``).
        limit: first N rows of each benchmark.
        output_dir: results folder.
        batch_size, seed, device: generation batch size, base seed, torch device.
        decoding: overrides of the preset's decoding (``max_new_tokens``, ``steps``,
            ``block_length``, ``temperature``, ``remasking``, ``cache``, ``threshold``).
        hash_weights: put the weights' SHA-256 in the manifest (slow for large models).
        project: the OpenCompass uv project (default: :func:`find_project`).
        locked: pass ``--locked`` (fail instead of re-locking a stale ``uv.lock``).
        env: extra environment variables for the child.
        timeout_s: kill the child after this many seconds (``subprocess.TimeoutExpired``).

    Raises:
        FileNotFoundError: ``uv`` is not on PATH or the project is not found.
    """
    uv = shutil.which("uv")
    if uv is None:
        raise FileNotFoundError("uv is not on PATH: install it (python3 -m pip install uv) to run "
                                "the OpenCompass harness")
    cmd = build_command(checkpoint, benchmarks, preset=preset, limit=limit,
                        output_dir=output_dir, batch_size=batch_size, seed=seed, device=device,
                        decoding=decoding, hash_weights=hash_weights, project=project,
                        locked=locked, uv=uv)
    child = dict(os.environ)
    # The caller may run inside the main workspace venv (uv run): do not leak it into the
    # OpenCompass project, whose own .venv uv selects.
    for key in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONHOME"):
        child.pop(key, None)
    for key, value in OFFLINE_ENV.items():
        if key.startswith(("HF_", "TRANSFORMERS_")):
            child[key] = value
        else:
            child.setdefault(key, value)
    child.update(env or {})
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    return subprocess.run(cmd, env=child, check=False, timeout=timeout_s).returncode
