"""Every RL algorithm on every family where it is defined, through the trainer's one RL step: a
step trains, zero advantages give zero gradient, the ratio is exactly 1 on-policy, and skipping
the old pass (row-local losses) changes nothing but the pass count."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dllm_algorithms as da
from tests.dllm_algorithms.cases import ALGORITHMS, IDS, PAIRS, prepared_batch, sampling_for
from tests.tiny_rl import FAMILIES, local_rl, text_reward, tiny_model

ALL_PAIRS = [(n, f) for n, alg in ALGORITHMS.items() for f in FAMILIES if f in alg.families]


@pytest.mark.parametrize(("name", "family"), ALL_PAIRS, ids=[f"{n}-{f}" for n, f in ALL_PAIRS])
def test_steps_change_the_trainable_parameters(name: str, family: str) -> None:
    model = tiny_model(family)
    rl = local_rl(model, ALGORITHMS[name], sampling=sampling_for(name), max_tokens_per_pass=32, reward=text_reward)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    changed = False
    for step in range(3):
        metrics = rl.step(step)
        assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
        assert {"reward_mean", "grad_norm", "update_passes", "response_length", "optimizer_steps"} <= set(metrics)
        alg = ALGORITHMS[name]
        per_iteration = 1
        if isinstance(alg, da.MDPO):  # one step per selected denoising step
            per_iteration = alg.top_k_steps
        if isinstance(alg, da.DTreeRPO):  # one step per tree node (rows per step = prompts)
            per_iteration = alg.trees * sum(alg.branching ** d for d in range(alg.depth))
        assert metrics["optimizer_steps"] == alg.num_iterations * per_iteration, metrics
        changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
        if changed:
            break
    assert changed, f"{name} on {family} did not change the parameters"


@pytest.mark.parametrize(("name", "family"), PAIRS, ids=IDS)
def test_zero_advantages_give_zero_gradient(name: str, family: str) -> None:
    # equal rewards: zero outcome advantages, and zero step / tree advantages derived in `prepare`
    model = tiny_model(family)
    rl, prepared, _ = prepared_batch(name, family, model, reward=lambda text, answer: 1.0)
    batch = prepared.batch
    rl.actor._step(prepared, ALGORITHMS[name].advantages(batch.scores, batch.group_ids), 0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(float(g.abs().max()) < 1e-6 for g in grads)


@pytest.mark.parametrize(("name", "family"), PAIRS, ids=IDS)
def test_on_policy_values_equal_old_values(name: str, family: str) -> None:
    alg = ALGORITHMS[name]
    if not alg.needs_old:
        pytest.skip(f"{name} has no old-policy values (no ratio)")
    model = tiny_model(family)
    rl, prepared, _ = prepared_batch(name, family, model, reuse=False)  # the separate old pass runs
    assert prepared.old is not None
    model.eval()
    with torch.no_grad():
        now = alg.values(rl.actor.scorer, prepared.batch, prepared.data, 0)
    assert torch.allclose(now, prepared.old[0], atol=1e-5)


@pytest.mark.parametrize("name", ["D1", "BGPO", "CJGRPO"])
def test_skipping_the_old_pass_changes_nothing_but_the_pass_count(name: str) -> None:
    out = []
    for reuse in (False, True):
        model = tiny_model("llada")
        rl, prepared, advantages = prepared_batch(name, "llada", model, reuse=reuse)
        assert (prepared.old is None) == reuse
        metrics = rl.actor._step(prepared, advantages, 0)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((metrics, grads))
    (m_ref, g_ref), (m, g) = out
    assert m["loss"] == pytest.approx(m_ref["loss"], rel=1e-6, abs=1e-7)
    for key in ("clip_frac", "ppo_kl"):
        if key in m_ref:
            assert m[key] == pytest.approx(m_ref[key], abs=1e-6)
    assert g.keys() == g_ref.keys() and g
    for n in g:
        torch.testing.assert_close(g[n], g_ref[n], rtol=1e-5, atol=1e-7)


def test_the_old_pass_is_kept_where_the_policy_moves_or_the_loss_couples_rows() -> None:
    from dllm_train import ActorWorker, OptimConfig

    model = tiny_model("llada")
    optim = OptimConfig(lr=1e-3)
    d1, coupled = ALGORITHMS["D1"], ALGORITHMS["CoupledGRPO"]
    assert ActorWorker(model, d1, optim).old_from_training_pass
    assert not ActorWorker(model, d1, optim, reuse_old=False).old_from_training_pass
    # the three copies of a token meet in its ratio: the update needs every row's value first
    assert not ActorWorker(model, coupled, optim).old_from_training_pass
    # a second update per batch runs after the weights moved: its old values need their own pass
    tree = dataclasses.replace(ALGORITHMS["DTreeRPO"], num_iterations=2)  # type: ignore[type-var]
    assert not ActorWorker(model, tree, optim).old_from_training_pass



def test_justgrpo_scores_at_the_temperature_the_rollout_sampled_at() -> None:
    import dllm_algorithms as da
    from dllm_train import Scorer, sample_seeds
    from tests.tiny_rl import SAMPLING, addition_prompts

    model = tiny_model("llada")
    rl = local_rl(model, da.JustGRPO(), sampling=dataclasses.replace(SAMPLING, block_length=1, temperature=0.7))
    prompts, answers, groups = addition_prompts(2, 2, 0)(0).expanded()
    rl.rank.rollout_step(0, prompts, answers, sample_seeds(0, len(prompts), "rollout", 0), groups)
    prepared = rl.rank.prepared
    assert prepared is not None

    def values(alg: da.JustGRPO) -> torch.Tensor:
        with torch.no_grad():
            return alg.values(Scorer(model), prepared.batch, prepared.data, 0)

    torch.testing.assert_close(values(da.JustGRPO()), values(da.JustGRPO(temperature=0.7)))
    assert float((values(da.JustGRPO()) - values(da.JustGRPO(temperature=1.0))).abs().max()) > 1e-3
    greedy = dataclasses.replace(prepared.batch.rollout, config=dataclasses.replace(SAMPLING, temperature=0.0))
    assert da.JustGRPO().scoring_temperature(dataclasses.replace(prepared.batch, rollout=greedy)) == 1.0
    with pytest.raises(ValueError, match="algorithm.temperature must be > 0"):
        da.JustGRPO(temperature=0.0)
