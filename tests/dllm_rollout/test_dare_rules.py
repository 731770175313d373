"""The commit rules of DARE's rollouts, transcribed from the code DARE runs, against ours.

- Block families (SDAR, LLaDA2; docs/generation.md#threshold-rule): SGLang's `LowConfidence`
  (SDAR EBPO / CJ-GRPO, LLaDA2 CJ-GRPO), lmdeploy's `low_confidence_dynamic` (SDAR BGPO) and
  LLaDA2's HF `generate` (LLaDA2 BGPO / EBPO) against `remasking="low_confidence_dynamic"`.
- Dream (docs/generation.md#dream): the cached block decoder of DARE's Dream rollouts
  (`generation_utils_block.py`, `alg="entropy"`, `top_p=0.95`) against `remasking="entropy"` with
  `commit_block_start=True`.

Decoding comparisons run one row at a time in float64 on a tiny model, sharing the uniform numbers:
where DARE draws with `torch.multinomial` / `Categorical`, the transcription inverts the CDF of the
same distribution at the row's own `RowNoise` numbers, in the order `dllm_rollout` draws them (equal
in law, docs/generation.md#llada). The mask token's logit is -inf in every forward (a hook), so the
distributions that include it (LLaDA2, lmdeploy, Dream) and those that exclude it (SGLang's fork,
`dllm_rollout`) are the same.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dllm_rollout import SamplingConfig, generate
from dllm_rollout.block import quota_at
from dllm_rollout.masked import transfer_quota
from dllm_rollout.noise import RowNoise
from dllm_rollout.sampling import propose_scored, select_above
from tests.dllm_rollout.conftest import tiny

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]
BL = 4
R = 10


def _no_mask_logit(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in float64 with the mask token's logit at -inf in every forward (module doc)."""
    mask = model.traits.mask_token_id  # type: ignore[attr-defined]

    def hook(_module: torch.nn.Module, _args: object, out: object) -> None:
        out.logits[..., mask] = float("-inf")  # type: ignore[attr-defined]

    model = model.double()
    model.register_forward_hook(hook)
    return model


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index drawn from `probs` [N, V] at uniforms u [N] (the shared stand-in for multinomial)."""
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, (u.double() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=probs.shape[-1] - 1)


# --- DARE's samplers, transcribed -----------------------------------------------------------------

def sglang_sample(logits: torch.Tensor, u: torch.Tensor, *, temperature: float, top_k: int | None,
                  top_p: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang `sample_block_tokens` (sgl-project/sglang python/sglang/srt/dllm/algorithm/sampling.py):
    greedy below T=1e-6 or top-k <= 1 (argmax of softmax(logits), its probability); else
    probs = softmax(logits / T), the draw from probs filtered by top-p then top-k (SGLang's
    `top_k_top_p_min_p_sampling_from_probs_torch`: both masks on the unfiltered sorted probs), and
    the confidence probs[x0] BEFORE the filters."""
    if temperature < 1e-6 or (top_k is not None and top_k <= 1):
        probs = torch.softmax(logits, dim=-1)
        x0 = probs.argmax(-1)
        return x0, probs.gather(-1, x0[:, None]).squeeze(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    kept = sorted_p.clone()
    if top_p is not None:
        kept[(sorted_p.cumsum(-1) - sorted_p) > top_p] = 0.0
    if top_k is not None:
        kept[:, top_k:] = 0.0
    filtered = torch.zeros_like(probs).scatter(-1, idx, kept)
    x0 = _inverse_cdf(filtered, u)
    return x0, probs.gather(-1, x0[:, None]).squeeze(-1)


def llada2_sample(logits: torch.Tensor, u: torch.Tensor, *, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA2 `_sample_with_temperature_topk_topp` with DARE's rollout arguments (no top-k, no top-p:
    verl/workers/rollout/llada2_rollout.py:65-73; models/LLaDA2.0-mini/modeling_llada2_moe.py:1425-1438):
    logits / T (T > 0, T != 1), softmax, one draw, its probability."""
    if temperature > 0 and temperature != 1.0:  # DARE: modeling_llada2_moe.py:1431-1432
        logits = logits / temperature
    probs = F.softmax(logits, dim=-1)
    x0 = _inverse_cdf(probs, u)  # DARE: torch.multinomial(probs, 1), modeling_llada2_moe.py:1436
    return x0, probs.gather(-1, x0[:, None]).squeeze(-1)


# --- DARE's commit rules, transcribed --------------------------------------------------------------

def sglang_commit(conf: torch.Tensor, masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """SGLang `LowConfidence.run` (yjyddq/sglang python/sglang/srt/dllm/algorithm/low_confidence.py, the
    fork DARE's SGLang rollouts run: verl/workers/rollout/sglang_rollout/sglang_sdar_rollout.py:95-97):
    confidence -inf off the masks; commit > threshold, else the single most confident."""
    confidence = torch.where(masked, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
    transfer = confidence > threshold
    if int(transfer.sum()) == 0:
        transfer[torch.topk(confidence, k=1).indices] = True
    return transfer


def lmdeploy_commit(conf: torch.Tensor, masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """lmdeploy `UnmaskingProcessor.low_confidence_dynamic` (InternLM/lmdeploy
    lmdeploy/pytorch/strategies/dllm/unmasking.py; DARE's SDAR BGPO server,
    recipe/sdar/run_bgpo_sdar_8b_chat.sh:85-99): scores 0 off the masks, the best set to the
    threshold, commit masks with score >= threshold."""
    scores = torch.where(masked, conf, conf.new_zeros(()))
    _, indices = scores[None].topk(1, dim=-1)
    scores = scores[None].scatter(-1, indices, threshold)[0]
    return masked & (scores >= threshold)


def llada2_commit(conf: torch.Tensor, masked: torch.Tensor, threshold: float, num_to_transfer: int) -> torch.Tensor:
    """LLaDA2 `generate`'s step (models/LLaDA2.0-mini/modeling_llada2_moe.py:1577-1591): all masks above
    the threshold if at least `num_to_transfer` are, else the top min(num_to_transfer, masks)."""
    transfer = torch.zeros_like(masked)
    confidence = torch.where(masked, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
    high = confidence > threshold
    if int(high.sum()) >= num_to_transfer:
        transfer = high
    else:
        idx = torch.topk(confidence, k=min(num_to_transfer, int(masked.sum()))).indices
        transfer[idx] = True
    return transfer


def llada2_schedule(block_length: int, steps: int) -> list[int]:
    """LLaDA2 `_get_num_transfer_tokens` (models/LLaDA2.0-mini/modeling_llada2_moe.py:1440-1448)."""
    base, remainder = block_length // steps, block_length % steps
    return [base + (1 if s < remainder else 0) for s in range(steps)]


# --- one row of a block-family rollout, DARE's way -----------------------------------------------

def dare_block_rollout(model: torch.nn.Module, prompt: list[int], seed: int, *, rule: str, threshold: float,
                       temperature: float, top_k: int | None = None, top_p: float | None = None,
                       dare_steps: int = BL) -> tuple[list[int], list[int]]:
    """One row, blocks on the global grid, every step a forward of [0, block end) (LLaDA2's HF
    `generate`, modeling_llada2_moe.py:1549-1603; SGLang and lmdeploy compute the same logits with a
    KV cache). `rule`: "sglang" (at most block_size steps per block, low_confidence.py `for _ in
    range(self.block_size)`), "lmdeploy" (a step until the block is unmasked; with top-k only, its
    draw from the top-k of logits / T and its score softmax(logits / T)[x0] are SGLang's) or "llada2"
    (`dare_steps` steps per block with LLaDA2's quota schedule; DARE passes steps = R/2 or R,
    recipe/llada2_mini/run_bgpo_llada2_mini.sh:97,104).

    Returns:
        (response tokens, the row's step at which each was committed).
    """
    mask = model.traits.mask_token_id  # type: ignore[attr-defined]
    p = len(prompt)
    total = -(-(p + R) // BL) * BL
    x = list(prompt) + [mask] * (total - p)
    step_of = [-1] * total
    noise = RowNoise(torch.tensor([seed]))
    row_step = 0
    schedule = llada2_schedule(BL, dare_steps)
    for start in range(p // BL * BL, total, BL):
        end = start + BL
        for step in range(dare_steps if rule == "llada2" else BL):
            masked = torch.tensor([x[j] == mask for j in range(start, end)])
            if not bool(masked.any()):
                break
            logits = model(torch.tensor([x[:end]])).logits[0, start:end].double()
            u = noise.uniform((BL,), torch.tensor([True]))[0]
            if rule in ("sglang", "lmdeploy"):
                x0, conf = sglang_sample(logits, u, temperature=temperature, top_k=top_k, top_p=top_p)
                commit = sglang_commit if rule == "sglang" else lmdeploy_commit
                transfer = commit(conf, masked, threshold)
            else:
                x0, conf = llada2_sample(logits, u, temperature=temperature)
                transfer = llada2_commit(conf, masked, threshold, schedule[step])
            for i in transfer.nonzero().flatten().tolist():
                x[start + i], step_of[start + i] = int(x0[i]), row_step
            row_step += 1
    return x[p:p + R], step_of[p:p + R]


def _multi_commit_steps(steps: list[int]) -> int:
    """Steps that committed more than one token (the threshold really acted)."""
    counts: dict[int, int] = {}
    for s in steps:
        counts[s] = counts.get(s, 0) + 1
    return sum(1 for c in counts.values() if c > 1)


@pytest.mark.parametrize("cache", [None, "prefix"])
@pytest.mark.parametrize(("family", "rule", "settings"), [
    # SDAR through SGLang (EBPO, CJ-GRPO): T=1, top-k 50 of DARE's scripts (here 5 of a 64-token vocabulary)
    ("sdar", "sglang", {"temperature": 1.0, "top_k": 5}),
    ("sdar", "sglang", {"temperature": 0.0}),
    # SDAR BGPO through lmdeploy: T=1, top-k 50
    ("sdar", "lmdeploy", {"temperature": 1.0, "top_k": 5}),
    # LLaDA2 CJ-GRPO through SGLang: T=0.6, top-p 0.95, top-k 50
    ("llada2_moe", "sglang", {"temperature": 0.6, "top_p": 0.95, "top_k": 5}),
    # LLaDA2 BGPO / EBPO through its HF generate: T=0.6, no filters, DARE's steps = R/2 per block
    ("llada2_moe", "llada2", {"temperature": 0.6}),
])
def test_block_threshold_rule_equals_dares(family: str, rule: str, settings: dict[str, object],
                                           cache: str | None) -> None:
    model = _no_mask_logit(tiny(family))
    threshold = 0.08  # a random tiny model's confidences: some steps pass it, most do not
    out = generate(model, PROMPTS, max_new_tokens=R, steps=BL, block_length=BL, remasking="low_confidence_dynamic",
                   threshold=threshold, cache=cache, stop_at_eos=False, record_trajectory=True, seed=3,
                   **settings)  # type: ignore[arg-type]
    assert out.unmask_step is not None
    multi = 0
    for row, prompt in enumerate(PROMPTS):
        tokens, steps = dare_block_rollout(model, prompt, int(out.seeds[row]), rule=rule, threshold=threshold,
                                           dare_steps=512 if rule == "llada2" else BL,
                                           **settings)  # type: ignore[arg-type]
        assert out.response_ids[row].tolist() == tokens
        assert out.unmask_step[row].tolist() == steps
        multi += _multi_commit_steps(steps)
    assert multi > 0  # the threshold committed several tokens in some steps


def test_lmdeploy_rule_equals_ours_but_at_the_threshold() -> None:
    """lmdeploy compares with >=, SGLang, LLaDA2 and `select_above` with >: the same commits on random
    confidences, and a confidence exactly at the threshold is lmdeploy's only difference."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        conf = torch.rand(8, generator=gen, dtype=torch.float64)
        masked = torch.rand(8, generator=gen) < 0.7
        if not bool(masked.any()):
            continue
        ours = select_above(conf[None], masked[None], torch.ones(1, dtype=torch.long), 0.6)[0]
        assert torch.equal(ours, lmdeploy_commit(conf, masked, 0.6))
        assert torch.equal(ours, sglang_commit(conf, masked, 0.6))
    conf = torch.tensor([0.9, 0.5, 0.2], dtype=torch.float64)
    masked = torch.ones(3, dtype=torch.bool)
    ours = select_above(conf[None], masked[None], torch.ones(1, dtype=torch.long), 0.5)[0]
    assert ours.tolist() == [True, False, False] == sglang_commit(conf, masked, 0.5).tolist()
    assert lmdeploy_commit(conf, masked, 0.5).tolist() == [True, True, False]


def test_llada2_steps_cap_equals_one_token_per_step() -> None:
    """DARE passes LLaDA2's generate steps = R/2 (1024) or R per block; its schedule is then one token
    for each of the first 32 steps and none after, so a block of 32 ends within 32 steps: the rule of
    `steps=32` with `select_above` and `quota_at`, step for step (float64 confidences)."""
    gen = torch.Generator().manual_seed(1)
    for dare_steps in (1024, 2048, 32):
        dare_schedule = llada2_schedule(32, dare_steps)
        ours_quota = transfer_quota(32, 32)
        for _ in range(20):
            dare_masked = torch.ones(32, dtype=torch.bool)
            ours_masked = dare_masked.clone()
            for step in range(dare_steps):
                if not bool(dare_masked.any()):
                    break
                conf = torch.rand(32, generator=gen, dtype=torch.float64) ** 4
                dare = llada2_commit(conf, dare_masked, 0.95 ** 4, dare_schedule[step])
                k = torch.tensor([quota_at(ours_quota, step, 32)])
                ours = select_above(conf[None], ours_masked[None], k, 0.95 ** 4)[0]
                assert torch.equal(dare, ours)
                dare_masked &= ~dare
                ours_masked &= ~ours
            assert step <= 32 and not bool(dare_masked.any())


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_dynamic_confidence_is_the_tempered_probability_before_filters(temperature: float) -> None:
    """The confidence of `low_confidence_dynamic` at our proposal = SGLang's (softmax(logits / T)[x0]
    before top-k / top-p), and LLaDA2's when it filters nothing."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 6, 40, generator=gen, dtype=torch.float64) * 3
    logits[..., 39] = float("-inf")  # the mask id
    noise = RowNoise(torch.tensor([5, 6]))
    active = torch.ones(2, dtype=torch.bool)
    x0, conf, _ = propose_scored(logits, remasking="low_confidence_dynamic", temperature=temperature, top_k=5,
                                 top_p=0.9, noise=noise, active=active, mask_id=39)
    u = RowNoise(torch.tensor([5, 6])).uniform((6,), active)
    for b in range(2):
        sx0, sconf = sglang_sample(logits[b], u[b], temperature=temperature, top_k=5, top_p=0.9)
        assert torch.equal(x0[b], sx0)
        torch.testing.assert_close(conf[b].double(), sconf, rtol=1e-6, atol=1e-7)
    x0, conf, _ = propose_scored(logits, remasking="low_confidence_dynamic", temperature=temperature, top_k=None,
                                 top_p=None, noise=RowNoise(torch.tensor([5, 6])), active=active, mask_id=39)
    for b in range(2):
        lx0, lconf = llada2_sample(logits[b], u[b], temperature=temperature)
        assert torch.equal(x0[b], lx0)
        torch.testing.assert_close(conf[b].double(), lconf, rtol=1e-6, atol=1e-7)


# --- Dream ---------------------------------------------------------------------------------------

def dream_sample_tokens(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float | None,
                        neg_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream `sample_tokens` (verl/workers/rollout/generation_utils_block.py:82-112; top_p_logits :60-71):
    logits / T, top-p (finfo.min fill), softmax, a draw (Categorical) or the argmax at T=0, and the
    negative entropy sum p log(p + 1e-10) as confidence with `neg_entropy`."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        sorted_logits, sorted_indices = torch.sort(logits, descending=True)
        cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove = cumulative_probs > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = 0
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove)
        logits = logits.masked_fill(drop, torch.finfo(logits.dtype).min)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        x0 = _inverse_cdf(probs, u)  # DARE: dists.Categorical(probs=probs).sample()
        confidence = probs.gather(-1, x0[:, None]).squeeze(-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


def dare_dream_rollout(model: torch.nn.Module, prompt: list[int], seed: int, *, max_new: int, steps: int,
                       block_length: int, temperature: float, top_p: float) -> list[int]:
    """One row of DARE's Dream rollout (`_sample`, verl/workers/rollout/generation_utils_block.py:517-738,
    `alg="entropy"`, rollout_utils.py:800-801), every forward over the whole canvas (DARE keeps the
    prefix's keys from the block's first forward, an approximation `cache=None` does not make)."""
    mask = model.traits.mask_token_id  # type: ignore[attr-defined]
    p = len(prompt)
    x = torch.tensor([prompt + [mask] * max_new])
    noise = RowNoise(torch.tensor([seed]))
    on = torch.tensor([True])
    steps_per_block = steps // (max_new // block_length)
    timesteps = torch.linspace(1, 1e-3, steps_per_block + 1)
    for num_block in range(max_new // block_length):
        start, end = p + num_block * block_length, p + (num_block + 1) * block_length
        logits = model(x).logits.double()
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        u = noise.uniform((block_length,), on)[0]
        _, x0 = dream_sample_tokens(logits[0, start:end], u, temperature, top_p)  # DARE :592
        x[:, start] = x0[0]  # DARE :593: the block's first position, whatever its confidence
        i = 1
        while True:
            mask_index = x[0, start:end] == mask
            if i == steps_per_block:  # DARE :686
                break
            logits = model(x).logits.double()
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            u = noise.uniform((block_length,), on)[0]
            t, s = timesteps[i], timesteps[i + 1]
            conf_all, x0_all = dream_sample_tokens(logits[0, start:end], u, temperature, top_p, neg_entropy=True)
            confidence, x0 = conf_all[mask_index], x0_all[mask_index]  # DARE: logits[mask_index]
            num_mask_token = mask_index.sum() / 1
            number_transfer_tokens = int(num_mask_token * (1 - s / t)) if i < steps_per_block - 1 else int(num_mask_token)
            full_confidence = torch.full((block_length,), float("-inf"), dtype=torch.float64)
            full_confidence[mask_index] = confidence
            if number_transfer_tokens > 0:
                # DARE: torch.topk(full_confidence, number_transfer_tokens), whose order among equal values
                # torch leaves unspecified; at low temperature top-p keeps one token at many positions, whose
                # confidences then tie (p log(p + 1e-10) of p = 1): lower index first, as dllm_rollout's `select`
                transfer_index = full_confidence.sort(descending=True, stable=True).indices[:number_transfer_tokens]
                x_ = torch.full((block_length,), mask)
                x_[mask_index] = x0
                x[0, start + transfer_index] = x_[transfer_index]
            i += 1
            if int((x[0, start:end] == mask).sum()) == 0:
                break
    return x[0, p:].tolist()


@pytest.mark.parametrize(("temperature", "top_p"), [(0.2, 0.95), (0.5, 0.95), (1.0, 0.95), (0.0, 1.0)])
def test_dream_block_rollout_equals_dares(temperature: float, top_p: float) -> None:
    model = _no_mask_logit(tiny("Dream"))
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    out = generate(model, prompts, max_new_tokens=12, steps=12, block_length=4, remasking="entropy",
                   commit_block_start=True, temperature=temperature, top_p=top_p, seed=7)
    for row, prompt in enumerate(prompts):
        ref = dare_dream_rollout(model, prompt, int(out.seeds[row]), max_new=12, steps=12, block_length=4,
                                 temperature=temperature, top_p=top_p)
        assert out.response_ids[row].tolist() == ref


def test_dream_entropy_confidence_equals_dreams() -> None:
    """`confidence("entropy")` on `propose`'s filtered, tempered probabilities = Dream's
    sum p log(p + 1e-10) of `sample_tokens(neg_entropy=True)` (float64 logits, float32 sampler)."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(1, 5, 50, generator=gen, dtype=torch.float64) * 2
    logits[..., 49] = float("-inf")
    active = torch.ones(1, dtype=torch.bool)
    x0, conf, _ = propose_scored(logits, remasking="entropy", temperature=0.2, top_k=None, top_p=0.95,
                                 noise=RowNoise(torch.tensor([9])), active=active, mask_id=49)
    u = RowNoise(torch.tensor([9])).uniform((5,), active)[0]
    dconf, dx0 = dream_sample_tokens(logits[0], u, 0.2, 0.95, neg_entropy=True)
    assert torch.equal(x0[0], dx0)
    torch.testing.assert_close(conf[0].double(), dconf, rtol=1e-5, atol=1e-6)


def test_dare_rules_refuse_what_they_cannot_run() -> None:
    with pytest.raises(ValueError, match="needs threshold"):
        SamplingConfig(max_new_tokens=8, steps=4, block_length=4, remasking="low_confidence_dynamic",
                       block_diffusion=True)
    with pytest.raises(ValueError, match="block-diffusion threshold rule"):
        SamplingConfig(max_new_tokens=8, steps=8, block_length=4, remasking="low_confidence_dynamic", threshold=0.9)
    with pytest.raises(ValueError, match="commit_block_start"):
        SamplingConfig(max_new_tokens=8, steps=8, block_length=4, commit_block_start=True)
    with pytest.raises(ValueError, match="editing_threshold"):
        SamplingConfig(max_new_tokens=8, steps=4, block_length=4, remasking="low_confidence_dynamic", threshold=0.7,
                       editing_threshold=0.5, block_diffusion=True)
