"""Triton kernels (GPU; importable without Triton, check `HAS_TRITON`, or `runs_on(x)` for a tensor).

`lse_and_target` / `logprob_grad_`: the fused log-prob's memory-bound halves. `rms_norm`,
`add_rms_norm`, `norm_rope`, `swiglu`: the decoder layers' elementwise work, each an autograd
function with a hand-written backward kernel (`dllm_models.layers` picks them through
`KernelConfig`).
"""

from dllm_models.kernels.logsumexp import HAS_TRITON, logprob_grad_, lse_and_target, runs_on
from dllm_models.kernels.rmsnorm import add_rms_norm, rms_norm
from dllm_models.kernels.rope import norm_rope
from dllm_models.kernels.glu import swiglu

__all__ = [
    "HAS_TRITON",
    "add_rms_norm",
    "logprob_grad_",
    "lse_and_target",
    "norm_rope",
    "rms_norm",
    "runs_on",
    "swiglu",
]
