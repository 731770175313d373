"""Dream's decoding algorithms against a direct re-implementation of their definitions
(docs/generation.md#dream)."""

from __future__ import annotations

import pytest
import torch

from dllm_rollout import filter_logits, generate


def _dream_reference(model: torch.nn.Module, prompt: list[int], r: int, steps: int, alg: str) -> torch.Tensor:
    """Dream `_sample` at temperature 0, batch 1, whole sequence (one block), top-k positions."""
    mask = model.traits.mask_token_id  # type: ignore[union-attr]
    x = torch.tensor([prompt + [mask] * r])
    ts = torch.linspace(1, 1e-3, steps + 1)
    for i in range(steps):
        mask_index = x == mask
        logits = model(x).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # shift: j read at j - 1
        ml = logits[mask_index].float()
        ml[:, mask] = float("-inf")
        probs = torch.softmax(ml, dim=-1)
        conf, x0 = probs.max(dim=-1)
        if alg == "topk_margin":
            top = probs.sort(dim=-1, descending=True).values
            conf = top[:, 0] - top[:, 1]
        elif alg == "entropy":
            conf = (probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
        t, s = ts[i], ts[i + 1]
        num_mask = mask_index.sum() / mask_index.shape[0]
        k = int(num_mask * (1 - s / t)) if i < steps - 1 else int(num_mask)
        full = torch.full_like(x, mask)
        full[mask_index] = x0
        if k > 0:
            cfull = torch.full(x.shape, float("-inf"))
            cfull[mask_index] = conf
            idx = cfull.topk(k, dim=-1).indices
            x[0, idx[0]] = full[0, idx[0]]
    return x[0, len(prompt):]


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_algorithms_match_definitions(tiny_dream: torch.nn.Module, alg: str) -> None:
    prompt = [1, 2, 3, 4]
    out = generate(tiny_dream, [prompt], max_new_tokens=8, steps=8, block_length=8, remasking=alg)
    assert torch.equal(out.response_ids[0], _dream_reference(tiny_dream, prompt, 8, 8, alg))


def test_dream_origin_and_alg_temp_complete(tiny_dream: torch.nn.Module) -> None:
    mask = tiny_dream.traits.mask_token_id  # type: ignore[union-attr]
    for kwargs in ({"remasking": "origin", "temperature": 1.0}, {"remasking": "entropy", "alg_temp": 0.3}):
        out = generate(tiny_dream, [[1, 2], [3, 4, 5]], max_new_tokens=8, steps=4, block_length=8, seed=0,
                       **kwargs)  # type: ignore[arg-type]
        assert not bool((out.response_ids == mask).any())


def test_top_p_keeps_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, None, 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5 + 0.3 crosses: keep both
    assert filter_logits(logits, 1, 0.7).isfinite().tolist() == [[True, False, False, False]]
