"""The one decoding rule: (benchmark, preset, model) -> the settings a benchmark decodes with.

`dare eval`, `run_benchmark`, held-out validation during training (`dllm_train.benchmark_validator`)
and the OpenCompass driver all call `resolve_decoding`, so a benchmark decodes alike everywhere:
the preset's settings for the benchmark (its group's, or the benchmark's own), the preset's
per-family changes (Dream: temperature 0.2, top-p 0.95 under `dare_local`), moved onto a block model's
grid (`dllm_rollout.on_model_grid`), then the caller's overrides (command-line flags, or a training
run's response lengths), checked on that grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dllm_rollout import SamplingConfig, configure, on_model_grid

from dllm_eval.benchmarks import Benchmark, get_benchmark
from dllm_eval.presets import Preset, get_preset


def resolve_decoding(bench: Benchmark | str, preset: Preset | str, *, family: str | None,
                     block_length: int | None, overrides: Mapping[str, Any] | None = None) -> SamplingConfig:
    """The settings `bench` decodes with under `preset` on a model of `family` with native block `block_length`.

    Args:
        bench: a benchmark or its name (`dllm_eval.BENCHMARKS`).
        preset: a preset or its name (`dllm_eval.PRESETS`).
        family: the model's family (`dllm_eval.infer_family`), for the preset's per-family decoding; None: none.
        block_length: the model's native block (`model.traits.block_length`); None for masked diffusion.
        overrides: SamplingConfig fields replacing the resolved ones (None values skipped), in the model's
            terms (a block model's `steps` are per block).

    Raises:
        ValueError: an override of `block_length` off a block model's grid, or a bad combination.
        TypeError: an override that is not a SamplingConfig field.
    """
    b = get_benchmark(bench) if isinstance(bench, str) else bench
    p = get_preset(preset) if isinstance(preset, str) else preset
    settings = on_model_grid(p.decoding_for(b.name, b.group, family), block_length, convert=True)
    changes = {k: v for k, v in (overrides or {}).items() if v is not None}
    return on_model_grid(configure(settings, **changes), block_length) if changes else settings


__all__ = ["resolve_decoding"]
