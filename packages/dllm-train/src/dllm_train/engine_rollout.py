"""Rollouts decoded by an inference engine colocated with the trainer (`rollout.engine=lmdeploy`).

The engine holds its own copy of the policy on the training GPU. Each rollout wakes it with the
actor's current weights (release names; a LoRA actor hands over its merged weights, the base
restored bit for bit after), checks that the engine serves exactly those tensors, decodes, and puts
the engine to sleep (weights to host memory, KV cache freed) so that the update has the GPU. The
trainer recomputes every old log-prob itself, so the estimators do not depend on the engine; what
the engine cannot provide is refused before any work (`check_engine_support`; a rollout record field
the run needs and the engine does not fill, by the one rule `dllm_train.check_rollout_record`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dllm_models import merged_adapters
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train.algorithm import RLAlgorithm
from dllm_train.dataflow import map_tensors
from dllm_train.rollout_record import check_rollout_record
from dllm_train.workers import Rollout, RolloutWorker, load_rollout_weights, sampling_for

ENGINE_FAMILIES = ("sdar", "sdar_moe")
"""Families lmdeploy 0.18's dLLM path serves."""

PROBE_ROWS = 4
"""Prompts of the greedy consistency probe of an engine rollout (`EngineRolloutWorker.consistency`)."""
PROBE_TOKENS = 64
"""Response tokens of that probe (at most the run's `max_new_tokens`)."""

EngineFactory = Callable[[Path, SamplingConfig, tuple[int, ...], int], Any]
"""(release folder, decoding settings, stop ids, pad id) -> an engine with `generate`, `sleep`,
`wake(weights)`, `check_weights(reference)` (`dllm_rollout.engines.LMDeployEngine`)."""


def check_engine_support(family: str, algorithm: RLAlgorithm[Any] | None, sampling: SamplingConfig,
                         folder: str | Path | None) -> None:
    """Raise, naming the setting and the fix, for what an engine rollout cannot provide: another
    family, a decoding rule it cannot run, no release folder, or a rollout record field the run
    needs (`check_rollout_record`)."""
    name = sampling.engine
    check_rollout_record(algorithm, sampling)
    if family not in ENGINE_FAMILIES:
        raise ValueError(f"rollout.engine={name} serves block-diffusion families {ENGINE_FAMILIES}; "
                         f"the model is {family!r}: set rollout.engine=native")
    if name == "lmdeploy":  # a decoding rule lmdeploy cannot run is refused before its engine starts
        from dllm_rollout.engines import lmdeploy_engine_config

        lmdeploy_engine_config(sampling)
    if folder is None or not (Path(folder) / "config.json").is_file():
        raise ValueError(f"rollout.engine={name} loads the model from a release-layout folder "
                         f"(config.json, tokenizer, safetensors); checkpoint.checkpoint={folder!r} is not one")


def token_agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> tuple[float, float]:
    """(share of equal tokens, mean length of the common prefix) of two lists of responses, row by row."""
    same = total = 0
    prefix: list[int] = []
    for x, y in zip(a, b, strict=True):
        n = min(len(x), len(y))
        eq = [x[i] == y[i] for i in range(n)]
        same += sum(eq)
        total += n
        prefix.append(next((i for i, e in enumerate(eq) if not e), n))
    return same / max(total, 1), sum(prefix) / max(len(prefix), 1)


def release_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under their release names: LoRA layers' base weights (`.base_layer.`
    dropped), adapters left out. Call inside `merged_adapters` to hand over merged weights."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = p.detach()
    return out


def lmdeploy_factory(folder: Path, sampling: SamplingConfig, stop_ids: tuple[int, ...], pad_id: int) -> Any:
    """An `LMDeployEngine` on `folder` with the run's decoding and its KV-cache share."""
    from dllm_rollout.engines import LMDeployEngine

    return LMDeployEngine(folder, sampling, stop_ids=stop_ids, pad_id=pad_id,
                          engine_options={"cache_max_entry_count": sampling.engine_kv_fraction})


class EngineRolloutWorker:
    """The rollout worker of `rollout.engine=lmdeploy`: the same interface as `RolloutWorker`.

    Args:
        model: the policy (the actor's module): its weights are handed to the engine each rollout.
        sampling: the run's decoding settings; algorithm: the run's algorithm (its records).
        folder: the release-layout folder the engine starts from (the run's checkpoint).
        factory: builds the engine (default: lmdeploy's, `lmdeploy_factory`).
    """

    def __init__(self, model: Any, sampling: SamplingConfig, *, algorithm: RLAlgorithm[Any] | None,
                 folder: str | Path | None, factory: EngineFactory | None = None) -> None:
        self.model = model
        self.sampling = sampling_for(model, sampling, algorithm)
        self.algorithm = algorithm
        self.ref_model = None
        check_engine_support(str(model.traits.family), algorithm, self.sampling, folder)
        assert folder is not None
        self.folder = Path(folder)
        self.factory: EngineFactory = factory or lmdeploy_factory
        self.engine: Any = None
        self.last_metrics: dict[str, float] = {}

    def _hand_over(self, weights: dict[str, torch.Tensor]) -> float:
        """Put `weights` into the engine (starting it the first time); returns the seconds it took."""
        t0 = time.perf_counter()
        traits = self.model.traits
        if self.engine is None:
            self.engine = self.factory(self.folder, self.sampling, traits.stop_ids, int(traits.pad_token_id))
            self.engine.load_weights(weights.items())
        else:
            self.engine.wake(weights.items())
        return time.perf_counter() - t0

    def _serve_policy(self) -> tuple[float, int]:
        """Hand the policy's current weights to the engine (merged adapters) and check that it serves
        exactly them; returns (hand-off seconds, tensors compared).

        Raises:
            RuntimeError: when the engine does not serve exactly the policy's weights.
        """
        with torch.no_grad(), merged_adapters(self.model):
            weights = release_weights(self.model)
            handoff_s = self._hand_over(weights)
            check = self.engine.check_weights(weights)
        if not check.ok:
            raise RuntimeError(
                f"the {self.sampling.engine} engine does not serve the policy's weights after the hand-off: "
                f"{len(check.mismatched)} of {check.total} tensors differ or are unknown "
                f"(e.g. {list(check.mismatched[:3])}); the rollout would come from other weights")
        return handoff_s, check.compared

    def generate(self, prompts: Sequence[Sequence[int]], seeds: torch.Tensor) -> RolloutBatch:
        """Hand the current weights to the engine, check them, decode `prompts`, put the engine to sleep.

        Raises:
            RuntimeError: when the engine does not serve exactly the policy's weights.
        """
        device = next(self.model.parameters()).device
        handoff_s, checked = self._serve_policy()
        t0 = time.perf_counter()
        batch = self.engine.generate(prompts, [int(s) for s in seeds.tolist()])
        decode_s = time.perf_counter() - t0
        self.engine.sleep()
        # the engine runs its own graphs: no native capture fails here (the native worker's metric, for one key set)
        self.last_metrics = {"engine_handoff_s": handoff_s, "engine_decode_s": decode_s,
                             "engine_weights_exact": 1.0, "engine_tensors_checked": float(checked),
                             "graph_capture_failures": 0.0}
        moved: RolloutBatch = map_tensors(batch, lambda t: t.to(device))
        return moved

    def consistency(self, rollout: RolloutBatch) -> dict[str, float]:
        """A greedy probe of the engine against the native decoder on the same weights.

        An engine returns no trajectory to replay, so the check decodes the rollout's first
        `PROBE_ROWS` prompts greedily for `PROBE_TOKENS` tokens (EOS ignored) twice: with the engine
        (woken with the policy's weights, checked, put back to sleep) and with `dllm_rollout.decode`
        on the policy. Both are deterministic functions of the same weights, so on a trained model
        they agree up to near-ties of the argmax, which floating-point rounding may flip.

        Returns:
            {"probe_token_agreement": share of equal response tokens, "probe_common_prefix": mean
            length of the rows' common prefix, "probe_rows", "probe_tokens"} (floats).
        """
        from dataclasses import replace

        from dllm_rollout import decode

        rows = min(PROBE_ROWS, rollout.batch_size)
        ids, mask = rollout.prompt_ids[:rows], rollout.prompt_mask[:rows].bool()
        prompts = [ids[i][mask[i]].tolist() for i in range(rows)]
        cfg = replace(self.sampling, temperature=0.0, top_k=None, top_p=None, stop_at_eos=False,
                      max_new_tokens=min(PROBE_TOKENS, self.sampling.max_new_tokens))
        seeds = torch.zeros(rows, dtype=torch.long)
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        self._serve_policy()
        served = self.engine.generate(prompts, seeds.tolist(), cfg=cfg).response_ids.tolist()
        self.engine.sleep()
        with torch.no_grad(), merged_adapters(self.model):
            native = decode(self.model, ids.to(device), mask.to(device), seeds.to(device),
                            replace(cfg, engine="native")).response_ids.tolist()
        self.model.train(was_training)
        agree, prefix = token_agreement(native, served)
        return {"probe_token_agreement": agree, "probe_common_prefix": prefix, "probe_rows": float(rows),
                "probe_tokens": float(cfg.max_new_tokens)}

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Weight hand-off into the policy copy (Ray replicas); the engine reads it at the next rollout."""
        load_rollout_weights(self.model, state)


def build_rollout_worker(model: Any, sampling: SamplingConfig, *, algorithm: RLAlgorithm[Any],
                         ref_model: Any = None, engine_folder: str | Path | None = None) -> Rollout:
    """The rank's rollout worker for `sampling.engine`: native decoding, or an engine on `engine_folder`."""
    if sampling.engine == "native":
        return RolloutWorker(model, sampling, algorithm=algorithm, ref_model=ref_model)
    return EngineRolloutWorker(model, sampling, algorithm=algorithm, folder=engine_folder)
