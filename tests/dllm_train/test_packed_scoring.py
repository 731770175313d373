"""The packed, fused-head likelihood path equals the padded path, values and gradients."""

from __future__ import annotations

import zlib

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
