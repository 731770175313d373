"""Every RL algorithm on every family where it is defined: a step trains, zero advantages give
zero gradient, the ratio is exactly 1 on-policy; slow learning tests on the addition task."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dare.algorithms import ALGORITHMS, get_algorithm
from dllm_rollout import SamplingConfig
from dllm_train import Experience, generator, sample_seeds
from tests.dllm_train.algo_helpers import FAMILIES, tiny_model, workflow

# small Monte-Carlo budgets and iteration counts keep each step fast on CPU
FAST = {
    "bgpo": {"mc_num": 2}, "espo": {"mc_num": 2, "num_iterations": 2}, "ebpo": {"mc_num": 2},
    "mdpo": {"top_k_steps": 2}, "d-treerpo": {"branching": 2, "depth": 2, "num_iterations": 2},
    "justgrpo": {"chunk_size": 2},
}
SAMPLING = {"justgrpo": SamplingConfig(max_new_tokens=4, steps=4, block_length=1, temperature=1.0)}
PAIRS = [(name, fam) for name, entry in ALGORITHMS.items() for fam in FAMILIES
         if fam in entry.families or (fam == "llada2" and "llada2" in entry.families)]


def fast(name: str) -> object:
    return dataclasses.replace(get_algorithm(name), **FAST.get(name, {}))  # type: ignore[type-var]


def _wf(name: str, family: str, **kw: object) -> tuple[object, torch.nn.Module]:
    model = tiny_model(family)
    return workflow(model, name, algorithm=fast(name), sampling=SAMPLING.get(name), **kw), model  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "family"), PAIRS, ids=[f"{n}-{f}" for n, f in PAIRS])
def test_one_step_changes_trainable_parameters(name: str, family: str) -> None:
    wf, model = _wf(name, family)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    changed = False
    for step in range(3):
        metrics = wf.step(step)  # type: ignore[attr-defined]
        assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
        changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
        if changed:
            break
    assert changed, f"{name} on {family} did not change the parameters"


@pytest.mark.parametrize(("name", "family"), [p for p in PAIRS if p[1] in ("llada", "sdar")],
                         ids=[f"{n}-{f}" for n, f in PAIRS if f in ("llada", "sdar")])
def test_zero_advantages_give_zero_gradient(name: str, family: str) -> None:
    wf, model = _wf(name, family, reward=lambda text, answer: 1.0)
    wf.step(0)  # type: ignore[attr-defined]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(float(g.abs().max()) < 1e-6 for g in grads)


@pytest.mark.parametrize(("name", "family"), [p for p in PAIRS if p[1] in ("llada", "sdar")],
                         ids=[f"{n}-{f}" for n, f in PAIRS if f in ("llada", "sdar")])
def test_on_policy_values_equal_old_values(name: str, family: str) -> None:
    wf, model = _wf(name, family)
    obj = wf.objective  # type: ignore[attr-defined]
    if not obj.needs_old:
        pytest.skip(f"{name} has no old-policy values (no ratio)")
    batch = wf.prompts(0)  # type: ignore[attr-defined]
    prompts, answers, groups = batch.expanded()
    rollout = wf.rollout.generate(prompts, sample_seeds(0, len(prompts), "rollout", 0))  # type: ignore[attr-defined]
    scores, _ = wf.reward.score(rollout, answers)  # type: ignore[attr-defined]
    exp = Experience(rollout=rollout, scores=scores, group_ids=groups)
    wf.actor.prepare(exp, generator(0, "plan", 0))  # type: ignore[attr-defined]
    exp.advantages = obj.advantages(scores, groups)
    model.eval()
    with torch.no_grad():
        now = obj.score(wf.actor.scorer, exp)  # type: ignore[attr-defined]
    old = exp.old_logp if obj.num_iterations == 1 else exp.old_logp[0]  # type: ignore[index]
    assert torch.allclose(now, old, atol=1e-5)


def _held_out_reward(model: torch.nn.Module, steps: int = 2) -> float:
    from tests.dllm_train.algo_helpers import TASK, partial_reward
    from dllm_rollout import generate

    pairs = TASK.eval_pairs[:20]
    out = generate(model, [TASK.encode(TASK.prompt(a, b)) for a, b in pairs], max_new_tokens=4, steps=4,
                   block_length=4, temperature=0.0, seed=0)
    texts = [TASK.tokenizer.decode(r) for r in out.response_ids.tolist()]
    return sum(partial_reward(t, TASK.answer(a, b)) for t, (a, b) in zip(texts, pairs)) / len(pairs)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in ALGORITHMS if "llada" in ALGORITHMS[n].families))
def test_rl_raises_held_out_reward_after_brief_sft(name: str) -> None:
    from dare.algorithms import SFT
    from dllm_train import OptimConfig, derive_seed
    from tests.dllm_train.algo_helpers import TASK

    torch.manual_seed(0)
    model = tiny_model("llada")
    sft = SFT().worker(model, lambda s: TASK.sft_batch(32, derive_seed(0, "sft", s)), OptimConfig(lr=3e-3),
                       steps=60, batch_size=32, seed=0)
    for s in range(60):
        sft.step(s)
    start = _held_out_reward(model)
    wf = workflow(model, name, algorithm=fast(name), sampling=SAMPLING.get(name), lr=3e-4, prompts_per_step=4)
    for step in range(30):
        wf.step(step)
    assert _held_out_reward(model) > start
