"""The value model (critic): `dllm_models.ValueModel` and `dllm_train.critic` on a tiny SDAR model.

A value model starts at 0 everywhere (zero head), is a copy the policy does not share, scores the
algorithm's rows with the policy's BD3LM layout, and one step of its worker moves its values
toward the returns; settings no value model can run under are refused with one clear error.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dllm_algorithms import TraceRL
from dllm_models import ValueModel, build_model
from dllm_rollout import RolloutBatch, SamplingConfig
from dllm_train import (
    OptimConfig, Prepared, RLBatch, Scorer, SpecialTokens, TrainerConfig, ValueScorer, ValueWorker, assemble_rank,
    plan_token_logp,
)
from dllm_models.logprob import output_head
from tests.dllm_models.tiny_configs import EOS, MASK, tiny_sdar_config


def _sdar() -> Any:
    model = build_model(tiny_sdar_config())
    model.reset_parameters(generator=torch.Generator().manual_seed(0), std=0.05)
    return model.eval()


def _batch(seed: int = 0) -> RLBatch:
    """8 samples in 2 groups of 4: prompt of one block, response of two blocks with a recorded trace."""
    g = torch.Generator().manual_seed(seed)
    b, p, r = 8, 4, 8
    cfg = SamplingConfig(max_new_tokens=r, steps=4, block_length=4, record_trajectory=True, block_diffusion=True)
    rollout = RolloutBatch(prompt_ids=torch.randint(0, 60, (b, p), generator=g), prompt_mask=torch.ones(b, p, dtype=torch.bool),
                           response_ids=torch.randint(0, 60, (b, r), generator=g),
                           response_mask=torch.ones(b, r, dtype=torch.bool), seeds=torch.arange(b),
                           unmask_step=torch.randint(0, 4, (b, r), generator=g) + 4 * (torch.arange(r) // 4), config=cfg)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    return RLBatch(rollout=rollout, scores=scores, group_ids=torch.arange(b) // 4, tokens=SpecialTokens(MASK, EOS, EOS))


def test_value_model_is_a_zero_headed_copy_of_the_policy() -> None:
    policy = _sdar()
    value = ValueModel.from_policy(policy)
    head = value.value_head.weight
    # train/init_sdar_value_model.py:61, :88-89: Linear(hidden_size, 1, bias=False) in the checkpoint's dtype, zeroed
    assert head.shape == (1, 48) and value.value_head.bias is None and head.dtype == torch.float32
    assert not head.any()
    ids = torch.randint(0, 60, (2, 8))
    out = value(ids, attention_mask=torch.ones(2, 8, dtype=torch.bool), position_ids=torch.arange(8).expand(2, 8))
    assert out.shape == (2, 8) and not out.any()  # first values are 0
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with torch.no_grad():
        for p in value.backbone.parameters():
            p.add_(1.0)
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in before.items())  # a copy, not shared
    assert value.traits is value.backbone.traits


def test_value_scorer_reads_the_head_on_the_policys_bd3lm_rows() -> None:
    policy = _sdar()
    value = ValueModel.from_policy(policy)
    with torch.no_grad():
        value.value_head.weight.normal_()
    batch = _batch()
    alg = TraceRL(value_model=True, min_group_accuracy=0.0, max_group_accuracy=1.0)
    data = alg.prepare(batch, torch.Generator())
    with torch.no_grad():
        got = alg.critic_values(ValueScorer(value), batch, data)
        # the same rows through the policy's scorer, with the value head in place of the LM head
        hidden: list[torch.Tensor] = []
        handle = output_head(policy).register_forward_hook(lambda m, args, out: hidden.append(args[0]))
        plan_token_logp(Scorer(policy), batch.rollout.input_ids, data.attention, data.plan)
        handle.remove()
    assert got.shape == data.active.shape and bool(got[data.active].abs().sum() > 0)
    assert not got[~data.active].any()
    # every trained token's value is the head on a hidden state of the policy's own BD3LM forward
    heads = torch.cat([(h @ value.value_head.weight.T).reshape(-1) for h in hidden])
    for v in got[data.active][:20].tolist():
        assert bool(((heads - v).abs() < 1e-5).any())


def test_a_value_step_moves_the_values_toward_the_returns() -> None:
    batch = _batch()
    alg = TraceRL(value_model=True, min_group_accuracy=0.0, max_group_accuracy=1.0, gamma=0.9, lam=0.95,
                  value_lr=1e-3)  # a visible step at toy size
    worker = ValueWorker(ValueModel.from_policy(_sdar()), alg, OptimConfig(lr=1.0, betas=(0.8, 0.9)),
                         max_tokens_per_pass=64)
    # the critic's own learning rate, the actor's other settings
    assert (worker.optim.cfg.lr, worker.optim.cfg.betas) == (1e-3, (0.8, 0.9))
    prepared = Prepared(batch=batch, data=alg.prepare(batch, torch.Generator()))
    old = worker.old_values(prepared)
    assert not old.any()  # zero head: the first values are 0
    targets = worker.targets(prepared, old, alg.advantages(batch.scores, batch.group_ids))
    active = prepared.data.active

    def error(values: torch.Tensor) -> float:
        return float(((values - targets.returns)[active] ** 2).mean())

    for _ in range(3):
        out = worker.update(prepared, old, targets)
    assert out["value_optimizer_steps"] == 1.0 and out["value_grad_norm"] > 0 and out["value_loss"] > 0
    new = worker.old_values(prepared)
    assert new[active].abs().sum() > 0 and error(new) < error(old)
    state = worker.state()
    fresh = ValueWorker(ValueModel.from_policy(_sdar()), alg, OptimConfig(lr=1.0))
    fresh.load_state(state)
    torch.testing.assert_close(fresh.old_values(prepared), new, rtol=0, atol=0)
    assert fresh.optim.updates == 3
    # value_every (the authors' train_value_every, on 1-based steps): every second step is steps 2, 4, ...
    every2 = ValueWorker(ValueModel.from_policy(_sdar()), TraceRL(value_model=True, value_every=2), OptimConfig())
    assert [every2.due(s) for s in range(4)] == [False, True, False, True] and all(map(worker.due, range(3)))


def test_value_model_settings_that_cannot_run_are_refused() -> None:
    alg = TraceRL(value_model=True)
    sampling = SamplingConfig(max_new_tokens=8, steps=4, block_length=4, block_diffusion=True, temperature=1.0)

    def shard(model: Any, *, offload: bool) -> Any:
        return model

    with pytest.raises(ValueError, match="trainer.backend=local"):
        assemble_rank(_sdar(), sampling=sampling, algorithm=alg, optim=OptimConfig(), trainer=TrainerConfig(),
                      reward=None, plan_generator=torch.Generator, shard=shard)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="declares no value model"):
        ValueWorker(ValueModel.from_policy(_sdar()), TraceRL(), OptimConfig())
    with pytest.raises(ValueError, match="value model"):
        from dllm_train import PolicyRank

        rank = assemble_rank(_sdar(), sampling=sampling, algorithm=TraceRL(), optim=OptimConfig(),
                             trainer=TrainerConfig(), reward=None, plan_generator=lambda s: torch.Generator())  # type: ignore[arg-type]
        PolicyRank(rollout=rank.rollout, reward=rank.reward, actor=rank.actor, reference=None,
                   plan_generator=rank.plan_generator, critic=ValueWorker(ValueModel.from_policy(_sdar()), alg,
                                                                          OptimConfig()))


@pytest.mark.parametrize("family", ["sdar", "llada2", "llada", "dream"])
def test_value_scorer_on_packed_rows_equals_the_padded_path(family: str) -> None:
    """The value model on the policy's packed training rows (`ValueScorer(attention=...)`, the fast path
    `assemble_rank` gives it: block families' shared-clean BD3LM layout, Dream's shifted read) returns
    the padded path's values and the same parameter gradients, in float64."""
    from tests.tiny_rl import tiny_model

    torch.manual_seed(0)
    value = ValueModel.from_policy(tiny_model(family, dtype=torch.float64))
    with torch.no_grad():
        value.value_head.weight.normal_(0.0, 0.5)  # a trained head: values that differ per position
    traits = value.traits
    g = torch.Generator().manual_seed(1)
    m, s = 6, 12
    clean = torch.randint(0, int(traits.mask_token_id), (m // 2, s), generator=g).repeat_interleave(2, dim=0)
    attn = torch.ones(m, s, dtype=torch.bool)
    attn[2:4, 10:] = False  # padding at the end of one sequence's two copies
    noised = (torch.rand(m, s, generator=g) < 0.4) & attn
    noised[:, :3] = False  # a clean prompt
    noisy = torch.where(noised, torch.full_like(clean, int(traits.mask_token_id)), clean)
    # padding reads nothing (the padded path of masked families leaves values there that no objective reads)
    weights = torch.randn(m, s, generator=g, dtype=torch.float64) * attn

    def run(scorer: ValueScorer) -> tuple[torch.Tensor, list[torch.Tensor]]:
        value.zero_grad()
        out = scorer(noisy, attn, clean, clean_ids=clean)
        (out * weights).sum().backward()
        return out.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in value.parameters()]

    padded, g_padded = run(ValueScorer(value))
    packed, g_packed = run(ValueScorer(value, attention="sdpa"))
    assert padded[attn].abs().sum() > 0
    torch.testing.assert_close(packed[attn], padded[attn], rtol=1e-10, atol=1e-10)
    # the families' RMSNorm and RoPE compute in float32 even for a float64 model (as the reference
    # implementations do), so gradients summed over the two layouts' different token sets agree to
    # float32 rounding (about 1e-7 relative here), not float64's
    for a, b in zip(g_packed, g_padded, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert any(t.abs().sum() > 0 for t in g_packed)


def test_assemble_rank_gives_the_value_model_the_policys_training_attention() -> None:
    from dllm_train import TrainerConfig as Trainer, resolved_attention
    from tests.tiny_rl import fast, local_rl, tiny_model

    wf = local_rl(tiny_model("sdar"), fast(TraceRL(value_model=True)), sampling=SamplingConfig(
        max_new_tokens=8, steps=4, block_length=4, temperature=1.0))
    critic = wf.rank.critic
    assert critic is not None
    assert critic.scorer.attention == resolved_attention(Trainer(), wf.rank.actor.model) == "sdpa"
    assert critic.scorer.attention == wf.rank.actor.scorer.attention
