"""MDPO's per-step records x^(t) equal DARE's (yjyddq/DARE at 83ae8a3).

DARE records at every denoising step the input canvas, the full prediction (a token sampled at
every position from softmax(filter(logits / T)), kept only where the canvas is masked:
`where(mask_index, x0, x)`) and the sampled token's probability under that distribution
(`verl/workers/rollout/mdpo_llada_rollout.py:123-180`, `mdpo_dream_rollout.py:118-172`). The
functions below transcribe those lines in float64. Sampling is the one thing that cannot be shared
(DARE's `dists.Categorical` vs our per-row counter streams): at temperature 0 nothing is sampled
and the whole LLaDA loop, commits included, is compared; at T > 0 DARE's draw is replaced by the
tokens our decoder drew at the masked positions, and every other part of the record is compared.

The tiny models' mask-token logit is set to -inf (a trained model gives it ~0 mass): our decoder
never proposes the mask token, DARE's could, and this test is about the records, not that rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from dllm_models.logprob import output_head
from dllm_rollout import SamplingConfig, generate
from tests.dllm_rollout.conftest import tiny

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16]]
Sampler = Callable[[torch.Tensor, int], torch.Tensor]  # (probs [1, L, V], step) -> tokens [1, L]


@contextmanager
def _no_mask_logit(model: Any) -> Iterator[None]:
    mask = model.traits.mask_token_id

    def hook(_m: torch.nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[..., mask] = float("-inf")
        return out

    handle = output_head(model).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _top_p_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    # DARE: verl/workers/rollout/mdpo_llada_rollout.py:39-49
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool)
    mask = mask.scatter_(-1, sorted_indices, sorted_indices_to_remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _top_k_logits(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    # DARE: verl/workers/rollout/mdpo_llada_rollout.py:52-57
    top_k = min(top_k, logits.size(-1))
    indices_to_remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(indices_to_remove, torch.finfo(logits.dtype).min)


def _dare_record_step(model: Any, x: torch.Tensor, gen_length: int, *, temperature: float, top_p: float | None,
                      top_k: int | None, sample: Sampler | None, step: int,
                      shift: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's records: (input, x0 record, confidence) over the response, and the raw x0 [1, L].

    DARE: mdpo_llada_rollout.py:127-171 (mdpo_dream_rollout.py:121-172 adds the logit shift)."""
    mask_id = model.traits.mask_token_id
    mask_index = x == mask_id
    record_input = x[:, -gen_length:].clone()
    logits = model(x, attention_mask=torch.ones_like(x)).logits
    if shift:  # DARE: mdpo_dream_rollout.py:126
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = _top_p_logits(logits, top_p)
    if top_k is not None and top_k > 0:
        logits = _top_k_logits(logits, top_k)
    p = F.softmax(logits, dim=-1)
    if temperature > 0:
        assert sample is not None
        x0 = sample(p, step)  # DARE: dists.Categorical(probs=p).sample()
        confidence = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        confidence, x0 = p.max(dim=-1)
    record_conf = confidence[:, -gen_length:].clone()
    record_x0 = torch.where(mask_index, x0, x)[:, -gen_length:].clone()
    return record_input, record_x0, record_conf, confidence


def _dare_llada_generate(model: Any, prompt: torch.Tensor, *, steps: int, gen_length: int,
                         block_length: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor],
                                                     list[torch.Tensor]]:
    """mdpo_diffusion_generate_llada at temperature 0, conf_alg='llada', rcr=False.

    DARE: verl/workers/rollout/mdpo_llada_rollout.py:97-206, get_num_transfer_tokens from
    verl/workers/rollout/generate.py:31-41."""
    mask_id = model.traits.mask_token_id
    x = torch.full((1, prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt.shape[1]] = prompt
    num_blocks = gen_length // block_length
    steps_per_block = max(1, steps // num_blocks)
    inputs, results, confs = [], [], []
    for num_block in range(num_blocks):
        end_idx = prompt.shape[1] + (num_block + 1) * block_length
        block_mask_index = x[:, end_idx - block_length:end_idx] == mask_id
        mask_num = block_mask_index.sum(dim=1, keepdim=True)
        num_transfer_tokens = (mask_num // steps_per_block).expand(-1, steps_per_block).clone()
        num_transfer_tokens[torch.arange(steps_per_block)[None] < mask_num % steps_per_block] += 1
        for i in range(steps_per_block):
            mask_index = x == mask_id
            inp, rec_x0, rec_conf, confidence = _dare_record_step(
                model, x, gen_length, temperature=0.0, top_p=None, top_k=None, sample=None, step=0, shift=False)
            inputs.append(inp)
            confs.append(rec_conf)
            results.append(rec_x0)
            remasking_confidence = confidence.clone()
            remasking_confidence[:, end_idx:] = -float("inf")
            x0 = torch.cat([x[:, :-gen_length], rec_x0], dim=1)
            remasking_confidence = torch.where(mask_index, remasking_confidence, torch.tensor(-float("inf")))
            num_tokens = int(num_transfer_tokens[0, i])
            if num_tokens > 0:
                _, select_indices = torch.topk(remasking_confidence[0], k=num_tokens)
                x[0, select_indices] = x0[0, select_indices]
    return x[:, -gen_length:], inputs, results, confs


def test_llada_records_equal_dare_at_temperature_zero() -> None:
    model = tiny("llada").double()
    r, steps, bl = 8, 8, 4
    with _no_mask_logit(model):
        out = generate(model, PROMPTS, max_new_tokens=r, steps=steps, block_length=bl, temperature=0.0,
                       record_steps=True)
        assert out.step_canvas is not None and out.step_x0 is not None and out.step_confidence is not None
        for i, prompt in enumerate(PROMPTS):
            final, inputs, results, confs = _dare_llada_generate(model, torch.tensor([prompt]), steps=steps,
                                                                  gen_length=r, block_length=bl)
            assert torch.equal(out.response_ids[i], final[0])
            assert out.step_canvas.shape[1] == len(inputs) == steps
            for s in range(steps):
                assert torch.equal(out.step_canvas[i, s], inputs[s][0]), (i, s)
                assert torch.equal(out.step_x0[i, s], results[s][0]), (i, s)
                torch.testing.assert_close(out.step_confidence[i, s].double(), confs[s][0], rtol=1e-5, atol=1e-7)


def _replay(records: torch.Tensor, prompt_len: int) -> Sampler:
    """DARE's draw replaced by ours at the masked positions (argmax elsewhere: never recorded as x0)."""

    def sample(p: torch.Tensor, step: int) -> torch.Tensor:
        x0 = p.argmax(-1)
        x0[:, prompt_len:] = records[step][None]
        return x0

    return sample


@pytest.mark.parametrize(("family", "temperature", "top_k", "top_p"), [
    ("llada", 0.6, None, None),  # DARE's LLaDA MDPO recipe: T = 0.6 (run_mdpo_llada_8b_instruct.sh:107)
    ("llada", 1.0, 5, 0.9),
    ("Dream", 0.2, None, 0.95),  # Dream's MDPO recipe: T = 0.2 (run_mdpo_dream_7b_instruct.sh:107), top-p 0.95
    ("Dream", 0.0, None, None),
])
def test_records_equal_dare_on_our_canvases(family: str, temperature: float, top_k: int | None,
                                            top_p: float | None) -> None:
    model = tiny(family).double()
    mask = model.traits.mask_token_id  # type: ignore[union-attr]
    r, steps, bl = 8, 8, 4
    with _no_mask_logit(model):
        out = generate(model, PROMPTS, max_new_tokens=r, steps=steps, block_length=bl, temperature=temperature,
                       top_k=top_k, top_p=top_p, record_steps=True, seed=3)
        assert out.step_canvas is not None and out.step_x0 is not None and out.step_confidence is not None
        for i, prompt in enumerate(PROMPTS):
            for s in range(out.step_canvas.shape[1]):
                canvas = out.step_canvas[i, s]
                if s > 0 and bool((canvas == mask).all()):
                    break  # padding after the row's last step
                x = torch.tensor([prompt + canvas.tolist()])
                inp, rec_x0, rec_conf, _ = _dare_record_step(
                    model, x, r, temperature=temperature, top_p=top_p, top_k=top_k,
                    sample=_replay(out.step_x0[i], len(prompt)), step=s, shift=family == "Dream")
                masked = canvas == mask
                assert bool(masked.any())
                assert torch.equal(out.step_x0[i, s], rec_x0[0]), (i, s)
                assert not bool((out.step_x0[i, s] == mask).any())  # a draft without masks
                got, want = out.step_confidence[i, s].double(), rec_conf[0]
                torch.testing.assert_close(got[masked], want[masked], rtol=1e-5, atol=1e-7)
                if temperature == 0:  # nothing sampled: the committed positions' confidences too
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_step_records_do_not_change_the_decoding() -> None:
    model = tiny("llada")
    cfg = dict(max_new_tokens=8, steps=8, block_length=4, temperature=1.0, seed=5)
    plain = generate(model, PROMPTS, **cfg)
    recorded = generate(model, PROMPTS, record_steps=True, **cfg)
    assert torch.equal(plain.response_ids, recorded.response_ids)
    assert recorded.step_x0 is not None
    # the committed tokens of each step are the record's at those positions
    recorded_traj = generate(model, PROMPTS, record_steps=True, record_trajectory=True, **cfg)
    assert recorded_traj.unmask_step is not None and recorded_traj.step_x0 is not None
    for s in range(recorded_traj.step_x0.shape[1]):
        now = recorded_traj.unmask_step == s
        assert torch.equal(recorded_traj.step_x0[:, s][now], recorded_traj.response_ids[now])


def test_step_records_refuse_a_cache() -> None:
    with pytest.raises(ValueError, match="record_steps=True with cache='prefix'"):
        SamplingConfig(max_new_tokens=8, steps=8, block_length=4, record_steps=True, cache="prefix")
