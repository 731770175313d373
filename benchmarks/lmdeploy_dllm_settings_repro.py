"""Reproduction for lmdeploy 0.18.0: the dLLM sampler gives one sequence's positions other sequences' settings.

Runs lmdeploy's own code on the CPU, no GPU and no model: two sequences with different sampling
settings (A: temperature 0.5, top_k 1; B: temperature 1.5, top_k 50) and dLLM block length 4.

- `DLLMSamplingStrategy.make_sampling_inputs` (lmdeploy/pytorch/strategies/dllm/sampling.py)
  expands every 1-D per-sequence tensor (temperature, top_k, top_p, min_p, random_seeds,
  random_offsets, num_ignore_eos, repetition_penalty) with `attr[None].repeat(block, 1).flatten(0, 1)`:
  block-major, [A, B, A, B, A, B, A, B]. Its 2-D tensors (bad_words, stop_words, all_ids) and
  `generated_ids_cpu` are expanded sequence-major, [A, A, A, A, B, B, B, B].
- The logits it is applied to are sequence-major: `DLLMModelAgentStrategy.slice_outputs`
  (lmdeploy/pytorch/strategies/dllm/model_agent.py) gathers each sequence's `block` last positions in
  turn, and `step_sampling_inputs` in the same file reads `num_ignore_eos` back with
  `.view(-1, block)`, as [sequence, position].

So logit row 1 (sequence A, position 1) is sampled with B's temperature and top-k. The results are wrong
only when the sequences of a batch have different settings. Uniform settings, which is what
`dllm_rollout.engines.LMDeployEngine` sends, are unaffected; see docs/benchmarks.md. The fix
upstream is `attr[:, None].repeat(1, block).flatten(0, 1)` (or `repeat_interleave(block, 0)`) for
the 1-D tensors.

    python3 benchmarks/lmdeploy_dllm_settings_repro.py      # with lmdeploy 0.18.0 installed
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any


def _stub_binary_deps() -> None:
    """Stand-ins for lmdeploy's compiled imports that the two functions never call (zmq, xgrammar,
    tvm_ffi), so the reproduction runs from lmdeploy's pure-Python sources alone."""

    def attr(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    for name in ("zmq", "zmq.asyncio", "xgrammar", "tvm_ffi"):
        try:
            __import__(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__getattr__ = attr  # type: ignore[method-assign]
            sys.modules[name] = module
    if "zmq.asyncio" in sys.modules and not hasattr(sys.modules["zmq"], "asyncio"):
        sys.modules["zmq"].asyncio = sys.modules["zmq.asyncio"]  # type: ignore[attr-defined]


def main() -> int:
    _stub_binary_deps()
    import torch
    from lmdeploy.messages import GenerationConfig
    from lmdeploy.pytorch.config import DLLMConfig
    from lmdeploy.pytorch.messages import SamplingParam
    from lmdeploy.pytorch.strategies.dllm.model_agent import DLLMModelAgentStrategy
    from lmdeploy.pytorch.strategies.dllm.sampling import DLLMSamplingStrategy

    block = 4

    def sequence(index: int, temperature: float, top_k: int) -> SimpleNamespace:
        gen = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=temperature, top_k=top_k,
                               random_seed=index)
        return SimpleNamespace(sampling_param=SamplingParam.from_gen_config(gen), num_valid_ids=10,
                               num_new_tokens=0, session=SimpleNamespace(session_id=index), seq_id=index,
                               generated_ids=torch.zeros(0, dtype=torch.long),
                               all_ids=torch.zeros(10, dtype=torch.long))

    seqs = [sequence(0, 0.5, 1), sequence(1, 1.5, 50)]
    inputs = DLLMSamplingStrategy(pad_token_id=0, dllm_block_length=block).make_sampling_inputs(seqs)
    agent = DLLMModelAgentStrategy(DLLMConfig(block_length=block), dllm_mask_token=0)
    # a prefill-free decoding step: each sequence forwards its block of `block` tokens
    rows = agent.slice_outputs(torch.arange(2 * block), torch.tensor([block, block]))
    owner = ["A" if int(r) < block else "B" for r in rows]
    temperature = [float(t) for t in inputs.temperature.tolist()]
    top_k = [int(k) for k in inputs.top_k.tolist()]
    print("logit row:                ", list(range(2 * block)))
    print("sequence of the logit row:", owner)
    print("temperature applied:      ", temperature)
    print("top_k applied:            ", top_k)
    want = {"A": (0.5, 1), "B": (1.5, 50)}
    wrong = [i for i, o in enumerate(owner) if (temperature[i], top_k[i]) != want[o]]
    print(f"logit rows sampled with another sequence's settings: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
