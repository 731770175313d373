"""trainer.backend="ray": a 2-rank FSDP2 actor group (gloo, CPU) runs RL steps of the tiny setup."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.dllm_train.helpers import tiny_config, tiny_workflow

pytestmark = pytest.mark.ray


def test_ray_workflow_runs_rl_steps_and_reports_the_local_metrics(ray_cluster: Any) -> None:
    from dare.quickstart import build_tiny_model
    from dare.tasks.addition import AdditionTask, build_tokenizer
    from dllm_train import PromptBatch, derive_seed
    from dllm_train.distributed import DistributedConfig, RayRLWorkflow
    from tests.dllm_train.distributed_helpers import tiny_rank_setup

    cfg = tiny_config()
    tok = build_tokenizer()
    task = AdditionTask(cfg.task, tok)
    local, _ = tiny_workflow(cfg)

    def prompts(step: int) -> PromptBatch:
        pairs = task.train_pairs(cfg.rl.prompts_per_step, derive_seed(cfg.trainer.seed, "rl-data", step))
        return PromptBatch([task.encode(task.prompt(a, b)) for a, b in pairs],
                           [task.answer(a, b) for a, b in pairs], cfg.rl.group_size)

    driver_model = build_tiny_model(cfg, tok)
    before = {k: v.clone() for k, v in driver_model.state_dict().items()}
    wf = RayRLWorkflow(setup_fn=tiny_rank_setup, prompts=prompts, objective=local.objective,
                       trainer=cfg.trainer, rl=cfg.rl, dist=DistributedConfig(num_workers=2),
                       driver_model=driver_model)
    try:
        expected = set(local.step(0))
        for step in range(2):
            metrics = wf.step(step)
            assert set(metrics) == expected
            assert all(isinstance(v, float) for v in metrics.values())
        assert metrics["skipped"] == 0.0
        wf.pull_weights(driver_model)
        assert any(not torch.equal(before[k], v) for k, v in driver_model.state_dict().items())
        state = wf.state()  # full optimizer state gathered on rank 0, round-trips through load_state
        assert state["updates"] == 2 and state["optimizer"]["state"]
        wf.load_state(state)
    finally:
        wf.shutdown()

