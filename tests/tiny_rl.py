"""Tiny RL setups for library tests, without the `dare` app: a character tokenizer, an addition
prompt sampler, tiny models of every family and an in-process RL phase for any algorithm."""

from __future__ import annotations

import dataclasses
import random
import zlib
from typing import Any

import torch

from dllm_models import build_model, char_tokenizer
from dllm_rollout import SamplingConfig
from dllm_train import LocalRL, OptimConfig, PromptBatch, RLAlgorithm, TrainerConfig, derive_seed
from tests.dllm_models.tiny_configs import TINY_CONFIGS

TOK = char_tokenizer("0123456789+=")
FAMILIES = ("llada", "dream", "sdar", "sdar_moe", "llada2")
_MODEL_TYPES = {"dream": "Dream", "sdar": "sdar", "sdar_moe": "sdar_moe", "llada2": "llada2_moe"}
SAMPLING = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0)


def special_ids() -> dict[str, int]:
    return {"vocab_size": len(TOK), "mask_token_id": TOK.mask_token_id, "eos_token_id": TOK.eos_token_id,
            "pad_token_id": TOK.pad_token_id}


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """A tiny `family` model (canonical family name) over `TOK`, seeded normal(0, 0.05) weights."""
    if family == "llada":
        raw: dict[str, Any] = {
            "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 32, "n_layers": 1, "n_heads": 2,
            "n_kv_heads": 2, "mlp_hidden_size": 64, "vocab_size": len(TOK), "embedding_size": len(TOK),
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_sequence_length": 64,
            "mask_token_id": TOK.mask_token_id, "eos_token_id": TOK.eos_token_id,
            "pad_token_id": TOK.pad_token_id, "torch_dtype": "float32",
        }
    else:
        raw = TINY_CONFIGS[_MODEL_TYPES[family]](**special_ids())
        if family == "dream":
            raw["max_position_embeddings"] = 64
    model = build_model(raw)
    model.reset_parameters(generator=torch.Generator().manual_seed(seed), std=0.05)  # type: ignore[operator]
    return model.to(dtype)


def partial_reward(text: str, answer: str) -> float:
    """Matching characters / answer length (an untrained model's group rewards then differ)."""
    return sum(a == b for a, b in zip(text, answer)) / len(answer)


def text_reward(text: str, answer: str) -> float:
    """A reward in [0, 1) keyed on the text alone: distinct responses get distinct rewards, so every
    group (and every node of a tree) whose samples differ carries a signal, whatever the random draws.
    For tests of the update's mechanics, where `partial_reward` of an untrained model is often 0."""
    return zlib.crc32(text.encode()) / 2**32


def addition_prompts(prompts_per_step: int, group_size: int, seed: int = 0) -> Any:
    """step -> PromptBatch of 3-digit additions ("123+456=" -> "0579"), deterministic in step."""
    def sample(step: int) -> PromptBatch:
        rng = random.Random(derive_seed(seed, "rl-data", step))
        pairs = [(rng.randrange(1000), rng.randrange(1000)) for _ in range(prompts_per_step)]
        ids = [TOK(f"{a:03d}+{b:03d}=", add_special_tokens=False)["input_ids"] for a, b in pairs]
        return PromptBatch(ids, [f"{a + b:04d}" for a, b in pairs], group_size)
    return sample


def local_rl(model: Any, algorithm: RLAlgorithm[Any], *, group_size: int = 4, prompts_per_step: int = 2,
             lr: float = 1e-3, grad_clip: float = 1.0, sampling: SamplingConfig | None = None,
             reward: Any = partial_reward, seed: int = 0, **trainer: Any) -> LocalRL:
    """An in-process RL phase of `algorithm` on `model` (trainer fields as keywords)."""
    return LocalRL(model, prompts=addition_prompts(prompts_per_step, group_size, seed), sampling=sampling or SAMPLING,
                   reward_fn=reward, detokenize=TOK.decode, algorithm=algorithm, optim=OptimConfig(lr=lr, grad_clip=grad_clip),
                   trainer=TrainerConfig(max_steps=1, seed=seed, **trainer))


def fast(algorithm: RLAlgorithm[Any]) -> RLAlgorithm[Any]:
    """`algorithm` with small Monte-Carlo budgets and iteration counts (fast CPU steps)."""
    small = {"BGPO": {"mc_num": 2}, "ESPO": {"mc_num": 2, "num_iterations": 2}, "EBPO": {"mc_num": 2},
             "MDPO": {"top_k_steps": 2}, "DTreeRPO": {"trees": 2, "branching": 2, "depth": 2, "num_iterations": 2, "row_shards": 2},
             "DMPO": {"num_iterations": 2}}
    return dataclasses.replace(algorithm, **small.get(type(algorithm).__name__, {}))  # type: ignore[type-var]


def reproducible(record: dict[str, Any]) -> dict[str, Any]:
    """A step's metrics without what a rerun cannot reproduce: wall-clock timings (`*_s`: rollout_s,
    old_s, reference_s, update_s) and memory peaks (`peak_gib`, `peak_rss_gib`, per phase too)."""
    from dllm_train.metrics import is_peak

    return {k: v for k, v in record.items() if not (k.endswith("_s") or is_peak(k))}


__all__ = ["FAMILIES", "SAMPLING", "TOK", "addition_prompts", "fast", "local_rl", "partial_reward", "reproducible", "special_ids", "text_reward",
           "tiny_model"]
