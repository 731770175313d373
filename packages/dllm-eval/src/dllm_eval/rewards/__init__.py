"""Verifiable rewards: math, countdown, sudoku, code; routed by ``data_source``."""

from dllm_eval.rewards.code import CodeRewardConfig, build_program, code_reward, extract_code, extract_mbpp_code
from dllm_eval.rewards.countdown import countdown_reward, evaluate_arithmetic, extract_answer_tag
from dllm_eval.rewards.math import (
    GSM8K_EXTRACTIONS,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    gsm8k_reward,
    is_equivalent,
    math_reward,
    normalize_answer,
)
from dllm_eval.rewards.registry import REWARDS, RewardFn, compute_reward, score
from dllm_eval.rewards.result import RewardResult
from dllm_eval.rewards.sudoku import sudoku_reward, sudoku_strict_reward

__all__ = [
    "GSM8K_EXTRACTIONS",
    "REWARDS",
    "CodeRewardConfig",
    "RewardFn",
    "RewardResult",
    "build_program",
    "code_reward",
    "compute_reward",
    "countdown_reward",
    "evaluate_arithmetic",
    "extract_answer_tag",
    "extract_boxed",
    "extract_code",
    "extract_hash_answer",
    "extract_last_number",
    "extract_mbpp_code",
    "gsm8k_reward",
    "is_equivalent",
    "math_reward",
    "normalize_answer",
    "score",
    "sudoku_reward",
    "sudoku_strict_reward",
]
