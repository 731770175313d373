"""`dare eval --engine lmdeploy`: the benchmark runner's generate function served by an engine.

The preset's decoding (the `SamplingConfig` `dllm_eval.run_benchmark` passes to its generate
function), in the model's decoding mode; `LMDeployEngine` maps it onto the engine's options or refuses
what it cannot run as `dllm_rollout.generate` does, naming the setting. One engine serves every
benchmark whose engine-level settings (block length, steps, unmasking) agree; a benchmark with
other ones gets an engine of its own (the previous one is closed first).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dllm_rollout import RolloutBatch, SamplingConfig, on_model_grid


class EngineGenerate:
    """A `dllm_eval.GenerateFn` that decodes with lmdeploy from the checkpoint folder's weights.

    Args:
        folder: the release-layout checkpoint folder.
        stop_ids: the ids that end a response (`DiffusionTraits.stop_ids`); pad_id: the padding id.
        engine_options: further `PytorchEngineConfig` fields.
    """

    def __init__(self, folder: str | Path, *, stop_ids: tuple[int, ...], pad_id: int,
                 engine_options: dict[str, Any] | None = None) -> None:
        self.folder, self.stop_ids, self.pad_id = Path(folder), stop_ids, pad_id
        self.options = dict(engine_options or {})
        self.engine: Any = None
        self.key: dict[str, Any] | None = None

    def _engine_for(self, cfg: SamplingConfig) -> Any:
        from dllm_rollout.engines import LMDeployEngine, lmdeploy_engine_config

        key = lmdeploy_engine_config(cfg)
        if self.engine is None or key != self.key:
            self.close()
            self.engine = LMDeployEngine(self.folder, cfg, stop_ids=self.stop_ids, pad_id=self.pad_id,
                                         engine_options=self.options)
            self.key = key
        self.engine.cfg = cfg
        return self.engine

    def __call__(self, model: Any, prompts: list[list[int]], cfg: SamplingConfig, *,
                 seed: list[int] | None = None) -> RolloutBatch:
        """Decode `prompts` with the engine (`model` only supplies the decoding mode)."""
        cfg = on_model_grid(cfg, model.traits.block_length)
        out: RolloutBatch = self._engine_for(cfg).generate(prompts, seed)
        return out

    def close(self) -> None:
        """Stop the current engine, if any."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def engine_generate(name: str, folder: str, model: Any) -> EngineGenerate | None:
    """The generate function of `--engine NAME` (None for the native decoder)."""
    if name == "native":
        return None
    traits = model.traits
    if traits.block_length is None:
        raise ValueError(f"--engine {name} serves block-diffusion models (SDAR); {folder} is a "
                         f"{traits.family} model: use --engine native")
    return EngineGenerate(folder, stop_ids=traits.stop_ids, pad_id=int(traits.pad_token_id))


__all__ = ["EngineGenerate", "engine_generate"]
