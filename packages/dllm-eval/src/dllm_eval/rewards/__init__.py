"""Verifiable rewards: math, countdown, sudoku, code; routed by ``data_source``."""

from dllm_eval.rewards.code import (
    CODE_SOURCES,
    IO_SOURCES,
    CodeRewardConfig,
    build_program,
    code_reward,
    extract_code,
    extract_mbpp_code,
)
from dllm_eval.rewards.countdown import countdown_reward, evaluate_arithmetic, extract_answer_tag
from dllm_eval.rewards.d1 import (
    d1_countdown_reward,
    d1_gsm8k_reward,
    d1_math_reward,
    d1_sudoku_reward,
    python_arithmetic,
)
from dllm_eval.rewards.dare import (
    DARE_UNITS,
    dare_countdown_reward,
    dare_grade,
    dare_math_reward,
    dare_sudoku_reward,
)
from dllm_eval.rewards.ground_truth import ground_truth_problem
from dllm_eval.rewards.hendrycks import hendrycks_normalize
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
from dllm_eval.rewards.registry import REWARD_MODES, REWARDS, RewardFn, compute_reward, score
from dllm_eval.rewards.stdio import outputs_match, parse_io_tests
from dllm_eval.rewards.result import RewardResult
from dllm_eval.rewards.sudoku import sudoku_reward, sudoku_strict_reward

__all__ = [
    "CODE_SOURCES",
    "DARE_UNITS",
    "GSM8K_EXTRACTIONS",
    "IO_SOURCES",
    "REWARDS",
    "REWARD_MODES",
    "CodeRewardConfig",
    "RewardFn",
    "RewardResult",
    "build_program",
    "code_reward",
    "compute_reward",
    "countdown_reward",
    "d1_countdown_reward",
    "d1_gsm8k_reward",
    "d1_math_reward",
    "d1_sudoku_reward",
    "dare_countdown_reward",
    "dare_grade",
    "dare_math_reward",
    "dare_sudoku_reward",
    "evaluate_arithmetic",
    "extract_answer_tag",
    "extract_boxed",
    "extract_code",
    "extract_hash_answer",
    "extract_last_number",
    "extract_mbpp_code",
    "ground_truth_problem",
    "gsm8k_reward",
    "hendrycks_normalize",
    "is_equivalent",
    "math_reward",
    "normalize_answer",
    "outputs_match",
    "parse_io_tests",
    "python_arithmetic",
    "score",
    "sudoku_reward",
    "sudoku_strict_reward",
]
