"""benchmarks/dare_peer_update.py and dare_remote.py: DARE's sdar-bgpo update procedure, checked on a stand-in.

CI has no DARE checkout, so the peer's logic runs here on a stand-in with DARE's interfaces: a tiny
dllm_models SDAR wrapped to the call signature of DARE's patched `SDARForCausalLM.forward`
(verl/models/transformers/sdar.py:158-253) and test-written equivalents of its block-diffusion
helpers (verl/workers/actor/block_diffusion_utils.py). The loading machinery (`load_dare`) runs on a
fake checkout whose files only record what was imported.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import dare_peer_update as peer  # noqa: E402
import dare_remote  # noqa: E402
from dllm_models import SDARConfig, SDARModel  # noqa: E402
from dllm_models.mask import AttentionMask  # noqa: E402

MASK, PAD, VOCAB, BLOCK = 63, 62, 64, 4


class StandInSDAR(torch.nn.Module):
    """DARE's patched SDAR call (sdar.py:205-253: hidden states, head on `logits_to_keep`, CE / p_mask)."""

    def __init__(self, inner: SDARModel) -> None:
        super().__init__()
        self.inner = inner
        self.calls: list[int] = []  # model positions of each forward

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, *, input_ids: torch.Tensor, attention_mask: AttentionMask, position_ids: torch.Tensor,
                use_cache: bool, return_dict: bool, logits_to_keep: torch.Tensor, ulysses_sp_training: bool,
                ulysses_sp_targets: torch.Tensor, ulysses_sp_p_mask: torch.Tensor,
                ulysses_sp_answer_len: torch.Tensor, ulysses_sp_return_token_loss: bool) -> Any:
        assert ulysses_sp_training and ulysses_sp_return_token_loss and return_dict and not use_cache
        self.calls.append(int(input_ids.numel()))
        hidden, _ = self.inner.hidden_states(input_ids, position_ids=position_ids, attention=attention_mask,
                                             attention_backend="sdpa")
        logits = self.inner.lm_head(hidden[logits_to_keep]).float()
        token = F.cross_entropy(logits, ulysses_sp_targets, reduction="none") / ulysses_sp_p_mask.float()
        full = hidden.sum(-1).float() * 0
        full = full.index_put(tuple(logits_to_keep.nonzero().T), token)
        return SimpleNamespace(block_diffusion_token_loss=full)


def artifacts(*, noisy_input_ids: torch.Tensor, clean_input_ids: torch.Tensor, attention_mask: torch.Tensor,
              position_ids: torch.Tensor, target_mask: torch.Tensor, p_mask: torch.Tensor, prompt_section_length: int,
              pad_token_id: int) -> Any:
    """Padding removed (rows of one prompt: equal valid counts), targets only on responses."""
    valid = attention_mask.bool()
    b, n = valid.shape[0], int(valid[0].sum())
    assert bool((valid.sum(1) == n).all())
    response = valid.clone()
    response[:, :prompt_section_length] = False

    def take(t: torch.Tensor) -> torch.Tensor:
        return t[valid].view(b, n)

    return SimpleNamespace(noisy_input_ids=take(noisy_input_ids), clean_input_ids=take(clean_input_ids),
                           target_mask=take(target_mask.bool() & response), p_mask=take(p_mask),
                           position_ids=take(position_ids), response_lengths=response.sum(1), sequence_length=n)


def full_tensors(art: Any) -> tuple[torch.Tensor, ...]:
    """[x_t ; x_0] ids and positions; targets and p_mask on the noisy half only."""
    target = torch.cat([art.target_mask, torch.zeros_like(art.target_mask)], 1)
    clean_targets = torch.cat([art.clean_input_ids, torch.full_like(art.clean_input_ids, -100)], 1)
    return (torch.cat([art.noisy_input_ids, art.clean_input_ids], 1), torch.cat([art.position_ids] * 2, 1), target,
            torch.where(target, clean_targets, -100), torch.cat([art.p_mask, torch.ones_like(art.p_mask)], 1))


def block_mask(art: Any, *, block_size: int, block_origin: str) -> AttentionMask:
    assert block_origin == "global"
    blocks = art.position_ids // block_size
    clean = torch.zeros_like(blocks, dtype=torch.bool)
    return AttentionMask(block_ids=torch.cat([blocks, blocks], 1), is_clean=torch.cat([clean, ~clean], 1))


def micro_batches(batch: Any, max_token_len: int, *, token_cost_multiplier: int, padded_batch: bool) -> Any:
    """Consecutive rows, as many as B x max(valid) x multiplier fits (at least one)."""
    valid = batch["attention_mask"].sum(1)
    per = max(max_token_len // (int(valid.max()) * token_cost_multiplier), 1)
    parts = [list(range(a, min(a + per, len(valid)))) for a in range(0, len(valid), per)]
    return [torch.cat([batch[i:i + 1] for i in part]) for part in parts], parts


def standin(inner: SDARModel) -> tuple[StandInSDAR, dare_remote.Dare]:
    return StandInSDAR(inner), dare_remote.Dare(model_cls=None, config_cls=None, artifacts=artifacts,
                                                block_mask=block_mask, full_tensors=full_tensors,
                                                micro_batches=micro_batches, patch=None)


def tiny_sdar() -> SDARModel:
    torch.manual_seed(0)
    cfg = SDARConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64, vocab_size=VOCAB, head_dim=8, block_size=BLOCK, mask_token_id=MASK,
                     eos_token_id=PAD, pad_token_id=PAD)
    model = SDARModel(cfg).float()
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.2)  # type: ignore[operator]
    return model


def rows(n: int = 4, mc: int = 3) -> dict[str, torch.Tensor]:
    return peer.dare_rows([[5, 6, 7, 8, 9]] * n, max_prompt=8, new_tokens=6, mc_num=mc, vocab=VOCAB, mask_id=MASK,
                          pad_id=PAD, seed=3)


class Capture(torch.optim.SGD):
    """Records the gradients the step sees (lr 0: parameters unchanged)."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.0)
        self.grads: list[torch.Tensor] = []

    def step(self, closure: Any = None) -> Any:
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


def reference_value(inner: SDARModel, batch: dict[str, torch.Tensor], r: int, i: int) -> torch.Tensor:
    """Normalised ELBO of row r, copy i, straight from the definition: [x_t ; x_0] of the unpadded row,
    BD3LM mask, -sum over masked response tokens of NLL / t, over the response length."""
    keep = batch["attention_mask"][r].bool()
    clean, noisy = batch["input_ids"][r][keep], batch["perturbed_seq"][r, i][keep]
    target = batch["mask_indices"][r, i][keep]
    n = len(clean)
    pos = torch.arange(n)
    blocks = pos // BLOCK
    q_clean = torch.cat([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)])
    all_blocks = torch.cat([blocks, blocks])
    same = all_blocks[:, None] == all_blocks[None, :]
    # noisy query: own noisy block + earlier clean blocks; clean query: clean blocks up to its own
    see = torch.where(q_clean[:, None], q_clean[None, :] & (all_blocks[None, :] <= all_blocks[:, None]),
                      (~q_clean[None, :] & same) | (q_clean[None, :] & (all_blocks[None, :] < all_blocks[:, None])))
    attention = AttentionMask(block_ids=all_blocks[None], is_clean=q_clean[None])
    assert torch.equal(attention.dense(2 * n, 2 * n, torch.device("cpu")).reshape(2 * n, 2 * n), see)
    hidden, _ = inner.hidden_states(torch.cat([noisy, clean])[None], position_ids=torch.cat([pos, pos])[None],
                                    attention=attention, attention_backend="sdpa")
    logp = inner.lm_head(hidden[0, :n]).float().log_softmax(-1)
    nll = -logp.gather(-1, clean[:, None])[:, 0]
    t = batch["p_mask"][r, i][keep]
    return -(nll / t)[target].sum() / batch["responses"].shape[1]


@pytest.mark.parametrize("max_token_len", [1, 10_000])  # one row per micro-batch; all rows in one
def test_update_gradient_is_dares_bgpo_objective(max_token_len: int) -> None:
    # DARE (sdar_dp_actor_bgpo.py:383-440): per micro-batch and copy i, loss_i = bgpo(...) x
    # len(micro) / mini-batch rows / mc_num, one backward each. On-policy (old = the old pass's
    # values) the ratio is 1 and unclipped, so d loss / d value_(r,i) = -A_r / (rows x mc_num) and
    # the accumulated gradient is that of J = -sum_(r,i) A_r value_(r,i) / (rows x mc_num).
    inner = tiny_sdar()
    model, dare = standin(inner)
    batch = rows()
    micros = peer.micro_batches(dare, batch, max_token_len)
    assert [len(m["input_ids"]) for m in micros] == ([1, 1, 1, 1] if max_token_len == 1 else [4])
    old = peer.old_pass(model, dare, micros, block_size=BLOCK, pad_id=PAD)
    model.calls.clear()
    opt = Capture(model.parameters())
    stats = peer.update(model, dare, micros, old, opt, block_size=BLOCK, pad_id=PAD, grad_clip=math.inf)
    n_rows, mc = 4, 3
    assert stats["forwards"] == len(micros) * mc  # one forward per copy of each micro-batch
    # 5 prompt + 6 response tokens, doubled ([x_t ; x_0]), per row of the micro-batch
    assert model.calls == [2 * 11 * len(m["input_ids"]) for m in micros for _ in range(mc)]
    inner.zero_grad()
    adv = batch["advantages"][:, 0]
    values = torch.stack([torch.stack([reference_value(inner, batch, r, i) for i in range(mc)]) for r in range(n_rows)])
    torch.testing.assert_close(torch.cat(old), values.detach(), rtol=1e-5, atol=1e-6)  # the old pass's values
    (-(adv[:, None] * values).sum() / (n_rows * mc)).backward()
    expected = [p.grad for p in model.parameters()]
    assert any(float(g.abs().max()) > 0 for g in expected)
    for got, want in zip(opt.grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)  # float32 sums in two orders


def test_dare_rows_are_dares_rollout_tensors() -> None:
    batch = peer.dare_rows([[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]], max_prompt=8, new_tokens=5, mc_num=4,
                           vocab=VOCAB, mask_id=MASK, pad_id=PAD, seed=0)
    ids, valid = batch["input_ids"], batch["attention_mask"].bool()
    assert ids.shape == (2, 13) and batch["perturbed_seq"].shape == (2, 4, 13)
    assert ids[0, :5].tolist() == [PAD] * 5 and ids[0, 5:8].tolist() == [1, 2, 3]  # left-padded prompt
    assert ids[1, :8].tolist() == [6, 7, 8, 9, 10, 11, 12, 13]  # the prompt's last max_prompt tokens
    assert valid[0].tolist() == [False] * 5 + [True] * 8 and bool(valid[1].all())
    assert batch["position_ids"][0].tolist() == [0] * 5 + list(range(8))
    assert torch.equal(ids[:, 8:], batch["responses"]) and int(batch["responses"].max()) < min(MASK, PAD)
    targets = batch["mask_indices"]
    assert not targets[..., :8].any() and bool(targets[..., 8:].any(-1).all())  # >= 1 target per copy
    assert torch.equal(batch["perturbed_seq"] == MASK, targets)
    assert bool((batch["p_mask"][targets] > 0).all())
    adv = batch["advantages"]
    assert bool((adv == adv[:, :1]).all()) and abs(float(adv[:, 0].sum())) < 1e-6
    with pytest.raises(ValueError, match="mc_num"):
        peer.dare_rows([[1]], max_prompt=4, new_tokens=2, mc_num=0, vocab=VOCAB, mask_id=MASK, pad_id=PAD)


def test_rows_slices_and_concatenates_like_a_tensordict() -> None:
    batch = peer.Rows({"input_ids": torch.arange(6).view(3, 2), "attention_mask": torch.ones(3, 2)})
    joined = torch.cat([batch[0:1], batch[2:3]])
    assert isinstance(joined, peer.Rows) and len(joined) == 2
    assert joined["input_ids"].tolist() == [[0, 1], [4, 5]]


def test_standin_kernels_compute_what_they_replace() -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    w = torch.randn(16, dtype=torch.float64)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(dare_remote.rms_norm_fn(x, w, None, eps=1e-6), want)
    t = torch.randn(2, 4, 7, 8)  # b h l d
    assert torch.equal(dare_remote.rearrange(t, "b h l d -> b l (h d)"), t.transpose(1, 2).reshape(2, 7, 32))
    assert torch.equal(dare_remote.rearrange(t, "b l h d -> b l (h d)"), t.reshape(2, 4, 56))
    with pytest.raises(NotImplementedError, match="install einops"):
        dare_remote.rearrange(t, "b h l d -> b (h l) d")
    cfg = SimpleNamespace(head_dim=8, hidden_size=32, num_attention_heads=4, rope_theta=10_000.0)
    inv, scale = dare_remote.default_rope(cfg)
    torch.testing.assert_close(inv, torch.tensor([10_000.0 ** (-k / 8) for k in (0, 2, 4, 6)]))
    assert scale == 1.0


def test_restore_rope_buffers_recomputes_what_init_computed() -> None:
    # transformers 5 leaves DARE's non-persistent inv_freq uninitialised (modeling_sdar.py:748-755 set it in __init__)
    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(head_dim=8, hidden_size=32, num_attention_heads=4, rope_theta=1e4)
            self.rope_init_fn = dare_remote.default_rope
            self.register_buffer("inv_freq", torch.full((4,), float("nan")), persistent=False)

    model = torch.nn.Sequential(Rotary())
    notes = dare_remote.restore_rope_buffers(model)
    rotary = model[0]
    assert torch.equal(rotary.inv_freq, dare_remote.default_rope(rotary.config)[0])
    assert rotary.original_inv_freq is rotary.inv_freq and rotary.attention_scaling == 1.0
    assert len(notes) == 1 and notes[0].startswith("0.inv_freq recomputed")
    assert dare_remote.restore_rope_buffers(model) == []  # already right: nothing to report


FAKE = {
    "verl/__init__.py": "raise ImportError('verl/__init__.py must not run')\n",
    "verl/utils/__init__.py": "raise ImportError('verl/utils/__init__.py must not run')\n",
    "verl/utils/ulysses.py": "WORLD = 1\n",
    "verl/utils/seqlen_balancing.py": "def rearrange_micro_batches(*a, **k):\n    return 'balancing'\n",
    "verl/models/transformers/sdar.py": "from verl.utils.ulysses import WORLD\nflex_attention = 'flex'\n"
                                        "def apply_sdar_ulysses_patch(model):\n    return WORLD\n",
    "verl/workers/actor/block_diffusion_utils.py": "".join(
        f"def {f}(*a, **k):\n    return '{f}'\n" for f in ("compact_block_diffusion_artifacts",
                                                           "build_block_diffusion_mask",
                                                           "build_full_block_diffusion_tensors")),
    "models/SDAR-8B-Chat/configuration_sdar.py": "class SDARConfig:\n    pass\n",
    "models/SDAR-8B-Chat/fused_linear_diffusion_cross_entropy.py": "",
    "models/SDAR-8B-Chat/modeling_sdar.py": "from .configuration_sdar import SDARConfig\n"
                                            "from flash_attn.ops.triton.layer_norm import rms_norm_fn\n"
                                            "from einops import rearrange\n"
                                            "class SDARForCausalLM:\n    norm = staticmethod(rms_norm_fn)\n",
}


@pytest.fixture
def clean_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("verl", dare_remote.PACKAGE, "flash_attn", "einops"):
            del sys.modules[name]


@pytest.mark.usefixtures("clean_modules")
def test_load_dare_imports_the_checkout_files_without_verls_init(tmp_path: Path) -> None:
    for name, text in FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    dare = dare_remote.load_dare(tmp_path, cpu_attention=True)
    assert dare.micro_batches() == "balancing" and dare.artifacts() == "compact_block_diffusion_artifacts"
    assert dare.block_mask() == "build_block_diffusion_mask" and dare.patch is not None and dare.patch(None) == 1
    assert dare.config_cls.__name__ == "SDARConfig"
    assert sys.modules["verl.models.transformers.sdar"].flex_attention is dare_remote.dense_flex_attention
    try:
        import flash_attn  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        assert dare.model_cls.norm is dare_remote.rms_norm_fn
        assert "flash_attn" not in sys.modules  # the stand-in left with the import
        assert any("flash_attn absent" in n for n in dare.notes)


def test_load_dare_names_the_missing_files(tmp_path: Path) -> None:
    (tmp_path / "verl").mkdir()
    with pytest.raises(ValueError, match=r"--dare-root=.*missing \[.*modeling_sdar\.py"):
        dare_remote.load_dare(tmp_path)
