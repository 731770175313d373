"""The packed, fused-head likelihood path equals the padded path, values and gradients."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
import torch

from dllm_models import build_model
from dllm_train.likelihood import Scorer
from tests.conftest import tiny_llada_config
from tests.dllm_models.tiny_configs import MASK, build_tiny

_KEYS = {"llada": "", "dream": "Dream", "sdar": "sdar", "llada2": "llada2_moe"}


def _model(family: str) -> torch.nn.Module:
    if family == "llada":
        model = build_model(tiny_llada_config(mask_token_id=MASK, vocab_size=64, embedding_size=64))
        model.reset_parameters(generator=torch.Generator().manual_seed(1), std=0.2)  # type: ignore[operator]
        return model.train()
    return build_tiny(_KEYS[family], seed=1).train()


def _batch(family: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded clean ids [3, 14], attention mask, and a noised copy (some blocks untouched)."""
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(0, 40, (3, 14), generator=g)
    attn = torch.ones(3, 14, dtype=torch.bool)
    attn[0, :5] = False  # 9 real tokens
    attn[1, :2] = False  # 12
    noise = (torch.rand(3, 14, generator=g) < 0.4) & attn
    noise[:, :8] = False
    noise[:, -1] = True
    noisy = torch.where(noise, torch.full_like(clean, MASK), clean)
    return clean, attn, noisy


def _scored(family: str, attn: torch.Tensor) -> torch.Tensor:
    """Positions whose log-prob both paths define alike (see the logit-shift note below)."""
    out = attn.clone()
    if family == "dream":
        out[torch.arange(attn.shape[0]), attn.long().argmax(-1)] = False
    return out


FAMILIES = ["llada", "dream", "sdar", "llada2"]
CASES = [(f, "sdpa") for f in FAMILIES] + [(f, "flex") for f in FAMILIES]
GPU_CASES = [("llada", "varlen"), ("dream", "varlen"), ("sdar", "flex"), ("llada2", "flex"), ("sdar", "bd3lm_kernel"),
             ("llada2", "bd3lm_kernel")]


@pytest.mark.parametrize(("family", "backend"), CASES)
def test_packed_scoring_equals_padded(family: str, backend: str) -> None:
    """CPU: values and gradients with sdpa on packed rows; flex (no CPU backward) values only."""
    _check(family, backend, "cpu", grads=backend != "flex")


@pytest.mark.gpu
@pytest.mark.parametrize(("family", "backend"), GPU_CASES)
def test_packed_scoring_equals_padded_on_gpu(family: str, backend: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _check(family, backend, "cuda", grads=True)


def _check(family: str, backend: str, device: str, *, grads: bool) -> None:
    # varlen (flash) has no float32 kernel: bf16 there, compared at bf16 tolerance; flex runs in
    # float32 (in bf16 a MoE token's expert choice can flip between the two paths)
    low = backend == "varlen"
    model = _model(family).to(device, torch.bfloat16 if low else torch.float32)
    # (on CUDA, Triton's float32 dots run in TF32: ~1e-3 relative)
    tol = {"rtol": 3e-2, "atol": 3e-2} if low else {"rtol": 5e-3, "atol": 5e-3} if device == "cuda" else \
        {"rtol": 1e-4, "atol": 1e-4}
    min_cos = 0.99 if low else 0.999
    clean, attn, noisy = (t.to(device) for t in _batch(family))

    def run(scorer: Scorer) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        with torch.set_grad_enabled(grads):
            lp = scorer(noisy, attn, clean, temperature=0.7)
        if grads:
            (lp * _scored(family, attn)).sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    grads_on = grads
    ref, ref_grads = run(Scorer(model))
    packed = Scorer(model, attention=backend)
    assert packed.attention == backend
    got, grads_got = run(packed)
    assert model.attention_backend == "sdpa"  # the rollout's backend is restored after scoring
    # Dream's logit shift: a row's first real token (a prompt token, never scored by an objective)
    # reads the state of the padding before it on the padded path, its own state on the packed one
    cmp = _scored(family, attn)
    torch.testing.assert_close(got * cmp, ref * cmp, **tol)
    assert torch.all(got[~attn] == 0)
    assert len(grads_got) == len(ref_grads) and (len(grads_got) > 0) == grads_on
    for a, b in zip(grads_got, ref_grads):
        if device == "cuda":
            cos = torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0)
            assert cos > min_cos or (a.abs().max() < 1e-6 and b.abs().max() < 1e-6), float(cos)
        else:
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    if family in ("sdar", "llada2"):
        # the blocks of a row without a noised token of that row score 0 on both paths (a row's
        # values never depend on the other rows); so does every position whose input is not
        # noised (`Scorer.noised_only`: the head runs on the noised tokens alone); the noised
        # positions get a real log-prob
        attn, noisy, clean = attn.cpu(), noisy.cpu(), clean.cpu()
        blocks = (attn.long().cumsum(-1) - 1).clamp(min=0) // 4
        quiet = torch.stack([attn[i] & ~torch.isin(blocks[i], blocks[i][noisy[i] != clean[i]])
                             for i in range(attn.shape[0])])
        # some quiet block of a row is noised in another row: the per-row rule is what is checked
        batch_noised = torch.isin(blocks, blocks[noisy != clean])
        assert (quiet & batch_noised).any()
        for lp in (got.cpu(), ref.cpu()):
            assert quiet.any() and torch.all(lp[quiet] == 0)
            noised = attn & (noisy != clean)
            assert torch.all(lp[noised] < 0) and torch.all(lp[attn & ~noised] == 0)


def test_unknown_training_backend_is_refused() -> None:
    model = _model("llada")
    with pytest.raises(ValueError, match="training attention 'fast'"):
        Scorer(model, attention="fast")


def test_trainer_config_validates_train_attention() -> None:
    from dllm_train import TrainerConfig, resolved_attention

    assert TrainerConfig(train_attention="flex").train_attention == "flex"
    # "auto": the exact fast path of the device (on CPU the padded path); "none" / "": padded
    cpu_model = _model("llada")
    assert resolved_attention(TrainerConfig(train_attention="auto"), cpu_model) is None
    assert resolved_attention(TrainerConfig(train_attention="none"), cpu_model) is None
    assert resolved_attention(TrainerConfig(), cpu_model) is None
    assert resolved_attention(TrainerConfig(train_attention="sdpa"), cpu_model) == "sdpa"
    with pytest.raises(ValueError, match="trainer.train_attention='fused'"):
        TrainerConfig(train_attention="fused")
    with pytest.raises(ValueError, match="sequence_parallel"):
        TrainerConfig(train_attention="sdpa", backend="ray", num_workers=2, sequence_parallel=2)


def test_rl_workflow_scores_on_packed_rows_when_asked() -> None:
    """Two RL steps of a block family scored on packed rows (`trainer.train_attention`) give the
    padded run's metrics."""
    from dllm_algorithms import BGPO
    from dllm_rollout import SamplingConfig
    from tests.tiny_rl import local_rl, tiny_model

    sampling = SamplingConfig(max_new_tokens=4, steps=4, block_length=4, temperature=1.0, block_diffusion=True)

    def run(attention: str) -> list[dict[str, float]]:
        # a reward with spread (an untrained model's partial-match rewards are all equal)
        wf = local_rl(tiny_model("sdar"), BGPO(mc_num=2), sampling=sampling, train_attention=attention,
                      reward=lambda text, answer: float(zlib.crc32(text.encode()) % 7) / 6)
        assert wf.actor.scorer.attention == (attention or None)
        return [wf.step(i) for i in range(2)]

    # (weights are not compared: Adam turns rounding of near-zero gradients into steps of ~lr)
    padded, packed = run(""), run("sdpa")
    assert all(m["grad_norm"] > 1e-6 for m in padded)  # advantages with signal: the updates are real
    for a, b in zip(padded, packed):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


# --- noisy copies carry only their noised blocks (the default packed BD3LM layout) ---------------

RESPONSE = 14
COPIES = 4


def _bgpo_rows(family: str, prompts: list[int], seed: int) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float64 tiny model and BGPO's rows: sequences of prompt + 14 response tokens, left-padded,
    `COPIES` count masks over the response each (`count_masks`, as `BGPO.prepare` draws them: one
    global count per copy, a uniformly random subset); copy 1 of sequence 0 without any noise.

    Returns:
        (model, noisy, attention, clean), rows [len(prompts) * COPIES, S].
    """
    from dllm_objectives import count_masks
    from tests.tiny_rl import tiny_model

    model = tiny_model(family, dtype=torch.float64).train()
    g = torch.Generator().manual_seed(seed)
    width = max(prompts) + RESPONSE
    ids = torch.randint(0, 12, (len(prompts), width), generator=g)
    attn = torch.zeros(len(prompts), width, dtype=torch.bool)
    response = torch.zeros_like(attn)
    for i, p in enumerate(prompts):
        attn[i, width - p - RESPONSE:] = True
        response[i, width - RESPONSE:] = True
    plan = count_masks(response, COPIES, generator=g)
    noisy = torch.where(plan.mask, model.traits.mask_token_id, ids[:, None]).flatten(0, 1)
    clean = ids.repeat_interleave(COPIES, 0)
    noisy[1] = clean[1]
    return model, noisy, attn.repeat_interleave(COPIES, 0), clean


def _forward_tokens(model: Any) -> tuple[list[int], Any]:
    """A list that receives the length of every forward's input (at the embedding), and the hook's handle."""
    body = model.model
    embed = body.embed_tokens if hasattr(body, "embed_tokens") else body.word_embeddings
    seen: list[int] = []
    handle = embed.register_forward_pre_hook(lambda _m, args: seen.append(args[0].numel()))
    return seen, handle


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


@pytest.mark.parametrize("noised_only", [True, False])
@pytest.mark.parametrize("prompts", [[8, 4, 12], [6, 9, 3]], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_noised_blocks_only_is_the_whole_layout_and_the_padded_path(family: str, prompts: list[int],
                                                                    noised_only: bool) -> None:
    """float64, BGPO's masks on 3 packed sequences (prompts block-aligned, or sharing their last
    block with the response), a copy without noise: the packed path whose noisy copies carry only
    their noised blocks gives the log-probs and parameter gradients of the whole-copy layout
    (`noised_blocks_only=False`, the layout before) and of the padded path, with sdpa; flex's
    values too (CPU flex has no backward); the forward runs fewer tokens (counted at the model's
    embedding): one clean copy per sequence plus the noised blocks' tokens."""
    from dllm_train.packed_scoring import packed_token_logp
    from tests.dllm_train.test_shared_context import _kept_by_hand

    model, noisy, attn, clean = _bgpo_rows(family, prompts, seed=len(prompts) + prompts[1])
    weights = torch.rand(noisy.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    bl = model.traits.block_length

    def run(fn: Any) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        model.zero_grad(set_to_none=True)
        seen, handle = _forward_tokens(model)
        try:
            lp = fn()
        finally:
            handle.remove()
        (torch.exp(lp.clamp(max=0)) * weights).sum().backward()
        return lp.detach(), _grads(model), seen

    sparse = run(lambda: Scorer(model, attention="sdpa", noised_only=noised_only)(noisy, attn, clean))
    whole = run(lambda: packed_token_logp(model, noisy, attn, clean, clean, temperature=1.0, block_length=bl,
                                          backend="sdpa", noised_only=noised_only, noised_blocks_only=False))
    padded = run(lambda: Scorer(model, noised_only=noised_only)(noisy, attn, clean))
    kept = _kept_by_hand(noisy, attn, clean, bl)
    real = attn.sum(-1).tolist()
    assert kept[1] == 0 and sum(kept) < sum(real) - real[1]  # some blocks and a whole copy hold no noise
    assert sparse[2] == [sum(real[::COPIES]) + sum(kept)]
    assert whole[2] == [sum(real[::COPIES]) + sum(real)]
    scale = max(float(g.abs().max()) for g in whole[1])
    assert scale > 0 and bool((sparse[0] != 0).any())
    torch.testing.assert_close(sparse[0], whole[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sparse[0], padded[0], rtol=1e-6, atol=1e-6)
    for a, b, c in zip(sparse[1], whole[1], padded[1]):
        assert float((a - b).abs().max()) <= 1e-6 * scale
        assert float((a - c).abs().max()) <= 1e-5 * scale
    with torch.no_grad():
        flex = Scorer(model.eval(), attention="flex", noised_only=noised_only)(noisy, attn, clean)
    torch.testing.assert_close(flex, whole[0], rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["flex", "bd3lm_kernel"])
@pytest.mark.parametrize("family", ["sdar", "llada2"])
def test_noised_blocks_only_on_gpu(family: str, backend: str) -> None:
    """CUDA, compiled flex and the BD3LM Triton kernel (float32, TF32 dots): log-probs and
    gradients of the layout with dropped blocks equal the whole-copy layout's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from dllm_train.packed_scoring import packed_token_logp

    model, noisy, attn, clean = _bgpo_rows(family, [6, 9, 3], seed=1)
    model = model.float().cuda()
    noisy, attn, clean = noisy.cuda(), attn.cuda(), clean.cuda()
    out = []
    for sparse in (True, False):
        model.zero_grad(set_to_none=True)
        lp = packed_token_logp(model, noisy, attn, clean, clean, temperature=1.0, block_length=4, backend=backend,
                               noised_blocks_only=sparse)
        torch.exp(lp.clamp(max=0)).sum().backward()
        out.append((lp.detach(), _grads(model)))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=5e-3, atol=5e-3)
    for a, b in zip(out[0][1], out[1][1]):
        cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)
        assert cos > 0.999 or (a.abs().max() < 1e-6 and b.abs().max() < 1e-6), float(cos)


def test_rows_without_noise_still_run_one_forward() -> None:
    """A call whose rows hold no noised token: the packed row is the clean copies alone, one
    forward runs (the lockstep rule: every call is one pass), every value is 0, and the backward
    runs and leaves zero gradients."""
    from tests.dllm_train.test_shared_context import _forward_tokens

    model, noisy, attn, clean = _bgpo_rows("sdar", [8, 4, 12], seed=0)
    scorer = Scorer(model, attention="sdpa")
    seen, handle = _forward_tokens(model)
    try:
        lp = scorer(clean, attn, clean)
    finally:
        handle.remove()
    assert seen == [int(attn[::COPIES].sum())]
    assert bool((lp == 0).all())
    model.zero_grad(set_to_none=True)
    lp.sum().backward()
    assert all(float(g.abs().max()) == 0 for g in _grads(model))
    assert scorer.row_cost(clean, attn, clean).tolist() == attn.sum(-1).tolist()
