"""Triton kernels (GPU; importable without Triton, check `HAS_TRITON`)."""

from dllm_models.kernels.logsumexp import HAS_TRITON, logprob_grad_, lse_and_target

__all__ = ["HAS_TRITON", "logprob_grad_", "lse_and_target"]
