"""TraceRL's registry entry: its recipes' defaults from its authors' configs (Gen-Verse/dLLM-RL at 10b4fd1).

TraceRL is not in DARE; every `_dllmrl(...)` row is a value of the authors' RL config for that family
(configs/rl_sdar.yaml for SDAR and TraDo, configs/rl_llada.yaml, configs/rl_dream.yaml), with the
line's text transcribed; every `_ours(...)` row says why the value is not a line of theirs. The
entry `tracerl` transcribes the authors' policy-only configs (TraceRL without its value model);
`tracerl-value` their config with a value model, configs/rl_sdar_with_value.yaml (SDAR and TraDo,
the only language-model families they train a value model for).
"""

from __future__ import annotations

from dare.algorithms.entry import Default, RLEntry
from dllm_algorithms import TraceRL

REPO = "Gen-Verse/dLLM-RL@10b4fd1"
_SDAR = ("sdar", "sdar_moe")  # the authors' block configs serve SDAR and TraDo ("set sdar for TraDo and SDAR")


def _dllmrl(key: str, value: object, source: str, quote: str, *families: str) -> Default:
    return Default(key=key, value=value, dare=source, quote=quote, families=families, repo=REPO)


def _ours(key: str, value: object, reason: str, *families: str) -> Default:
    return Default(key=key, value=value, reason=reason, families=families, repo=REPO)


def _common(cfg: str, families: tuple[str, ...], lines: dict[str, int]) -> tuple[Default, ...]:
    """The rows every config of the authors writes alike (line numbers differ per file)."""
    return (
        _dllmrl("algorithm.clip", 0.2, f"{cfg}:{lines['eps']}", "eps: 0.20", *families),
        _dllmrl("algorithm.kl_coef", 0.01, f"{cfg}:{lines['beta']}", "beta: 0.01", *families),
        _dllmrl("rl_optim.lr", 1e-6, f"{cfg}:{lines['lr']}", "learning_rate: 1e-6", *families),
        _dllmrl("rl_optim.betas", (0.9, 0.999), f"{cfg}:{lines['beta1']}-{lines['beta1'] + 1}",
                "beta1: 0.9 / beta2: 0.999", *families),
        _dllmrl("rl_optim.weight_decay", 0.0, f"{cfg}:{lines['wd']}", "weight_decay: 0.0", *families),
        _dllmrl("rl_optim.grad_clip", 1.0, f"{cfg}:{lines['clip']}", "max_grad_norm: 1.0", *families),
    )


_SDAR_CFG = "configs/rl_sdar.yaml"
_LLADA_CFG = "configs/rl_llada.yaml"
_DREAM_CFG = "configs/rl_dream.yaml"

TRACERL_DEFAULTS: tuple[Default, ...] = (
    # SDAR / TraDo (block diffusion)
    _dllmrl("rl.prompts_per_step", 64, f"{_SDAR_CFG}:36", "num_task_per_step: 64", *_SDAR),
    _dllmrl("rl.group_size", 16, f"{_SDAR_CFG}:37", "num_response_per_task: 16", *_SDAR),
    _dllmrl("rollout.temperature", 1.0, f"{_SDAR_CFG}:38", "temperature: 1.0", *_SDAR),
    _dllmrl("rollout.max_new_tokens", 2000, f"{_SDAR_CFG}:39", "max_token: 2000", *_SDAR),
    _dllmrl("rollout.block_length", 4, f"{_SDAR_CFG}:40", "block_size: 4", *_SDAR),
    _dllmrl("rollout.steps", 4, f"{_SDAR_CFG}:41", "denoising_steps_per_block: 4", *_SDAR),
    _dllmrl("rollout.top_p", 1.0, f"{_SDAR_CFG}:42", "top_p: 1.0", *_SDAR),
    _ours("rollout.top_k", None, "top_k: 0 (configs/rl_sdar.yaml:43) turns the filter off "
          "(sample/jetengine_ext/engine/scheduler.py:85-88 filters only when top_k > 0)", *_SDAR),
    _dllmrl("rollout.remasking", "low_confidence_dynamic", f"{_SDAR_CFG}:44",
            'remasking_strategy: "low_confidence_dynamic"', *_SDAR),
    _dllmrl("rollout.threshold", 0.9, f"{_SDAR_CFG}:45", "dynamic_threshold: 0.9", *_SDAR),
    _dllmrl("data.max_prompt_length", 784, f"{_SDAR_CFG}:65", "max_prompt_len: 784", *_SDAR),
    _dllmrl("algorithm.shrink", 1, f"{_SDAR_CFG}:62", "shrink: 1", *_SDAR),
    *_common(_SDAR_CFG, _SDAR, {"eps": 68, "beta": 69, "lr": 76, "beta1": 78, "wd": 80, "clip": 59}),
    # LLaDA (masked diffusion)
    _dllmrl("rl.prompts_per_step", 32, f"{_LLADA_CFG}:33", "num_task_per_step: 32", "llada"),
    _dllmrl("rl.group_size", 8, f"{_LLADA_CFG}:34", "num_response_per_task: 8", "llada"),
    _dllmrl("rollout.temperature", 0.8, f"{_LLADA_CFG}:35", "temperature: 0.8", "llada"),
    _dllmrl("rollout.steps", 512, f"{_LLADA_CFG}:36", "steps: 512", "llada"),
    _dllmrl("rollout.max_new_tokens", 512, f"{_LLADA_CFG}:37", "max_gen_length: 512", "llada"),
    _dllmrl("rollout.remasking", "low_confidence", f"{_LLADA_CFG}:39",
            'remasking_strategy: "low_confidence_static"', "llada"),
    _dllmrl("rollout.block_length", 32, f"{_LLADA_CFG}:42", "block_size: 32", "llada"),
    _dllmrl("data.max_prompt_length", 512, f"{_LLADA_CFG}:64", "max_prompt_len: 512", "llada"),
    _dllmrl("algorithm.shrink", 8, f"{_LLADA_CFG}:60", "shrink: 8", "llada"),
    *_common(_LLADA_CFG, ("llada",), {"eps": 65, "beta": 66, "lr": 73, "beta1": 75, "wd": 77, "clip": 56}),
    # Dream (masked diffusion, the authors' cached block decoder)
    _dllmrl("rl.prompts_per_step", 32, f"{_DREAM_CFG}:32", "num_task_per_step: 32", "dream"),
    _dllmrl("rl.group_size", 8, f"{_DREAM_CFG}:33", "num_response_per_task: 8", "dream"),
    _dllmrl("rollout.temperature", 0.8, f"{_DREAM_CFG}:34", "temperature: 0.8", "dream"),
    _dllmrl("rollout.steps", 1024, f"{_DREAM_CFG}:37", "steps: 1024", "dream"),
    _dllmrl("rollout.max_new_tokens", 1024, f"{_DREAM_CFG}:38", "max_gen_length: 1024", "dream"),
    _dllmrl("rollout.top_p", 0.9, f"{_DREAM_CFG}:40", "top_p: 0.9", "dream"),
    _dllmrl("rollout.top_k", 50, f"{_DREAM_CFG}:41", "top_k: 50", "dream"),
    _ours("rollout.remasking", "maskgit_plus", "low_confidence_static with target confidence (configs/rl_dream.yaml:"
          "39-42): the sampled token's probability ranks the masks (sample/dream_rl_rollout.py:74-79), Dream's "
          "maskgit_plus confidence", "dream"),
    _ours("rollout.commit_block_start", True, "the authors' Dream rollout commits each block's first position at "
          "its first step (sample/dream_rl_rollout.py:203), as DARE's Dream block decoder does", "dream"),
    _dllmrl("rollout.block_length", 32, f"{_DREAM_CFG}:45", "block_size: 32", "dream"),
    _dllmrl("data.max_prompt_length", 512, f"{_DREAM_CFG}:67", "max_prompt_len: 512", "dream"),
    _dllmrl("algorithm.shrink", 8, f"{_DREAM_CFG}:63", "shrink: 8", "dream"),
    *_common(_DREAM_CFG, ("dream",), {"eps": 68, "beta": 69, "lr": 76, "beta1": 78, "wd": 80, "clip": 59}),
)
"""TraceRL's recipe defaults per family, each with its line of the authors' configs or a reason."""

_VALUE_CFG = "configs/rl_sdar_with_value.yaml"

TRACERL_VALUE_DEFAULTS: tuple[Default, ...] = (
    _dllmrl("rl.prompts_per_step", 64, f"{_VALUE_CFG}:38", "num_task_per_step: 64", *_SDAR),
    _dllmrl("rl.group_size", 16, f"{_VALUE_CFG}:39", "num_response_per_task: 16", *_SDAR),
    _dllmrl("rollout.temperature", 1.0, f"{_VALUE_CFG}:40", "temperature: 1.0", *_SDAR),
    _dllmrl("rollout.max_new_tokens", 2000, f"{_VALUE_CFG}:41", "max_token: 2000", *_SDAR),
    _dllmrl("rollout.block_length", 4, f"{_VALUE_CFG}:42", "block_size: 4", *_SDAR),
    _dllmrl("rollout.steps", 4, f"{_VALUE_CFG}:43", "denoising_steps_per_block: 4", *_SDAR),
    _dllmrl("rollout.top_p", 1.0, f"{_VALUE_CFG}:44", "top_p: 1.0", *_SDAR),
    _ours("rollout.top_k", None, f"top_k: 0 ({_VALUE_CFG}:45) turns the filter off "
          "(sample/jetengine_ext/engine/scheduler.py:85-88 filters only when top_k > 0)", *_SDAR),
    _dllmrl("rollout.remasking", "low_confidence_dynamic", f"{_VALUE_CFG}:46",
            'remasking_strategy: "low_confidence_dynamic"', *_SDAR),
    _dllmrl("rollout.threshold", 0.9, f"{_VALUE_CFG}:47", "dynamic_threshold: 0.9", *_SDAR),
    _dllmrl("rl_optim.grad_clip", 1.0, f"{_VALUE_CFG}:61", "max_grad_norm: 1.0", *_SDAR),
    _dllmrl("algorithm.shrink", 1, f"{_VALUE_CFG}:64", "shrink: 1", *_SDAR),
    _dllmrl("data.max_prompt_length", 784, f"{_VALUE_CFG}:67", "max_prompt_len: 784", *_SDAR),
    _dllmrl("algorithm.clip", 0.2, f"{_VALUE_CFG}:68", "eps: 0.20", *_SDAR),
    _dllmrl("algorithm.kl_coef", 0.01, f"{_VALUE_CFG}:69", "beta: 0.01", *_SDAR),
    _dllmrl("rl_optim.lr", 1e-6, f"{_VALUE_CFG}:78", "policy_learning_rate: 1e-6", *_SDAR),
    _dllmrl("rl_optim.betas", (0.9, 0.999), f"{_VALUE_CFG}:81-82", "beta1: 0.9 / beta2: 0.999", *_SDAR),
    _dllmrl("rl_optim.weight_decay", 0.0, f"{_VALUE_CFG}:83", "weight_decay: 0.0", *_SDAR),
    # the value model: the config names one (:22 value_base_model), which rl.py turns on
    _dllmrl("algorithm.value_model", True, "rl.py:21-22", 'if OmegaConf.select(config, "model.value_base_model", '
            "default=MISSING) is not MISSING: have_value_model = True", *_SDAR),
    _dllmrl("algorithm.gamma", 1.0, f"{_VALUE_CFG}:70", "gam: 1.0", *_SDAR),
    _dllmrl("algorithm.lam", 1.0, f"{_VALUE_CFG}:71", "lam: 1.0", *_SDAR),
    # train/train_sdar_value.py:998 clips the values with the policy's config.training.eps
    _dllmrl("algorithm.value_clip", 0.2, f"{_VALUE_CFG}:68", "eps: 0.20", *_SDAR),
    _dllmrl("algorithm.value_lr", 5e-6, f"{_VALUE_CFG}:79", "value_learning_rate: 5e-6", *_SDAR),
    _dllmrl("algorithm.value_every", 1, f"{_VALUE_CFG}:14", "train_value_every: 1", *_SDAR),
)
"""TraceRL-with-value's recipe defaults (SDAR and TraDo), each with its line of the authors' config."""

TRACERL = RLEntry(name="tracerl", algorithm=TraceRL(), paper="Wang et al., arXiv 2509.06949",
                  defaults=TRACERL_DEFAULTS)
"""The registry entry `tracerl` (recipes `<family>-tracerl`)."""


class TraceRLWithValue(TraceRL):
    """TraceRL with its value model (Wang et al., arXiv 2509.06949): the authors train one for SDAR and
    TraDo only (configs/rl_sdar_with_value.yaml), so its recipes are those families'."""

    families = _SDAR


TRACERL_VALUE = RLEntry(name="tracerl-value", algorithm=TraceRLWithValue(value_model=True),
                        paper="Wang et al., arXiv 2509.06949", defaults=TRACERL_VALUE_DEFAULTS)
"""The registry entry `tracerl-value` (recipes `sdar-tracerl-value`, `sdar_moe-tracerl-value`)."""

__all__ = ["TRACERL", "TRACERL_DEFAULTS", "TRACERL_VALUE", "TRACERL_VALUE_DEFAULTS", "TraceRLWithValue"]
