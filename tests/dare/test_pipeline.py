"""An RL recipe end to end on a tiny released-layout checkpoint and shipped RL data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dare.cli import main
from dare.quickstart import build_tiny_model
from dare.tasks.addition import build_tokenizer
from dllm_models import load_model, save_model
from tests.dare.helpers import measured, tiny_config


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_tokenizer()
    path = tmp_path_factory.mktemp("ckpt") / "tiny-llada"
    save_model(build_tiny_model(tiny_config(), tok), path, tokenizer=tok)
    raw = json.loads((path / "config.json").read_text())  # positions for the shipped countdown prompts
    (path / "config.json").write_text(json.dumps({**raw, "max_sequence_length": 4096}))
    # a release's generation config: its EOS (no further stop id) and sampling defaults
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": raw["eos_token_id"], "temperature": 0.6}))
    return path


def test_rl_recipe_trains_from_a_checkpoint_folder_and_exports(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = main(["train", "llada-d1", f"checkpoint.checkpoint={tiny_checkpoint}", "checkpoint.dtype=float32",
                 "data.train_files=countdown", "data.eval_files=sudoku", "data.max_prompt_length=4096",
                 "rollout.max_new_tokens=8", "rollout.steps=8", "rollout.block_length=8",
                 "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=2", "trainer.eval_every=2",
                 "trainer.save_every=1", "trainer.keep_checkpoints=1", "--output-dir", str(out), "--no-progress"])
    assert code == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and "eval/sudoku_accuracy" in records[1]
    # saved after steps 1 and 2; keep_checkpoints=1 leaves only the newest
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["0-rl-000002"]
    assert set(load_model(out / "model").state_dict()) == set(load_model(tiny_checkpoint).state_dict())
    # the export keeps the release's generation_config.json (stop ids, sampling defaults)
    assert (out / "model" / "generation_config.json").read_text() == (tiny_checkpoint / "generation_config.json").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "eval/sudoku_score" in summary["results"]["final_eval"]


def test_recipe_without_checkpoint_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as err:
        main(["train", "llada-d1", "--output-dir", str(tmp_path / "x")])
    assert err.value.code == 2


@pytest.fixture(scope="module")
def sums_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 two-digit sums in the nested RL schema (prompt messages, reward_model.ground_truth)."""
    pairs = [(12, 34), (5, 71), (40, 40), (9, 9), (63, 20), (18, 27), (77, 11), (30, 6)]
    path = tmp_path_factory.mktemp("rl-data") / "sums.parquet"
    pq.write_table(pa.table({
        "data_source": ["gsm8k"] * len(pairs),
        "prompt": [[{"role": "user", "content": f"{a:02d}+{b:02d}="}] for a, b in pairs],
        "reward_model": [{"ground_truth": str(a + b)} for a, b in pairs],
        "extra_info": [{"index": i} for i in range(len(pairs))],
    }), path)
    return path


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow])])
def test_rl_recipe_resumes_exactly_on_each_backend(backend: str, tiny_checkpoint: Path, sums_parquet: Path,
                                                    tmp_path: Path, request: pytest.FixtureRequest,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from dllm_train.distributed import RayRLWorkflow

    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    ray_steps: list[int] = []
    ray_step = RayRLWorkflow.step

    def counted_step(self: RayRLWorkflow, i: int) -> dict[str, float]:
        ray_steps.append(i)
        return ray_step(self, i)

    monkeypatch.setattr(RayRLWorkflow, "step", counted_step)

    # ESPO: a reference model (k2 KL), which must stay the initial policy after a resume, and
    # two off-policy optimizer steps per batch
    def train(out: Path, steps: int) -> int:
        return main(["train", "llada-espo", f"checkpoint.checkpoint={tiny_checkpoint}", "checkpoint.dtype=float32",
                     "algorithm.num_iterations=2",
                     f"data.train_files={sums_parquet}", "rollout.max_new_tokens=4", "rollout.steps=4",
                     "rollout.block_length=4", "rl.prompts_per_step=2", "rl.group_size=2", "rl_optim.lr=1e-3",
                     f"trainer.backend={backend}", "trainer.num_workers=2", f"trainer.max_steps={steps}",
                     "trainer.save_every=1", "--output-dir", str(out), "--no-progress"])

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train(straight, 2) == 0
    assert train(resumed, 1) == 0
    assert train(resumed, 2) == 0  # the same folder again: resumes after its step-1 checkpoint
    # every step ran on the Ray ranks, and the resumed run only step 2
    assert ray_steps == ([0, 1, 0, 1] if backend == "ray" else [])
    for ckpt in sorted((resumed / "checkpoints").iterdir()):
        owner = torch.load(ckpt / "trainer_state.pt", weights_only=False)["owner"]
        if backend == "ray":  # the ranks wrote their own shards; no optimizer state went through the driver
            assert (ckpt / "shards" / ".metadata").is_file() and "optimizer" not in owner
        else:
            assert not (ckpt / "shards").exists() and owner["optimizer"]["state"]
    assert measured(resumed / "metrics.jsonl") == measured(straight / "metrics.jsonl")  # (without timings)
    assert json.loads((straight / "metrics.jsonl").read_text().splitlines()[1])["kl"] > 0  # a reference at work
    a, b = load_model(straight / "model").state_dict(), load_model(resumed / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    start = load_model(tiny_checkpoint).state_dict()
    assert any(not torch.equal(a[k], start[k]) for k in a)  # the trained weights reached the export


def test_rl_recipe_honours_num_threads(tiny_checkpoint: Path, sums_parquet: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)  # recorded, not applied to the test process
    assert main(["train", "llada-d1", f"checkpoint.checkpoint={tiny_checkpoint}", "checkpoint.dtype=float32",
                 f"data.train_files={sums_parquet}", "rollout.max_new_tokens=4", "rollout.steps=4",
                 "rollout.block_length=4", "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=1",
                 "trainer.num_threads=3", "--output-dir", str(tmp_path / "run"), "--no-progress"]) == 0
    assert threads == [3]


def test_an_rl_run_stores_the_rollout_records_it_is_asked_for(tiny_checkpoint: Path, sums_parquet: Path,
                                                              tmp_path: Path) -> None:
    from dllm_train import read_rollouts

    out = tmp_path / "run"
    assert main(["train", "llada-cj-grpo", f"checkpoint.checkpoint={tiny_checkpoint}", "checkpoint.dtype=float32",
                 f"data.train_files={sums_parquet}", "rollout.max_new_tokens=4", "rollout.steps=4",
                 "rollout.block_length=4", "rl.prompts_per_step=2", "rl.group_size=2", "trainer.max_steps=2",
                 "trainer.save_rollouts_every=2", "--output-dir", str(out), "--no-progress"]) == 0
    stored = read_rollouts(out)
    assert list(stored) == [2] and len(stored[2]) == 1
    record = stored[2][0]
    # CJ-GRPO's declared field (record_fields) and the always-cheap forwards, with the run's sampling settings
    assert {"unmask_step", "forwards", "config"} <= record.filled_fields() and record.batch_size == 4
    config = json.loads((out / "config.json").read_text())
    assert record.config is not None and record.config.max_new_tokens == config["rollout"]["max_new_tokens"] == 4
    assert record.config.record_trajectory and not config["rollout"]["record_trajectory"]


def test_the_ray_driver_keeps_its_policy_copy_on_the_cpu_unless_it_validates() -> None:
    from dare.config import apply_overrides
    from dare.pipeline import driver_device
    from dare.recipes import get_recipe

    cfg = get_recipe("sdar-bgpo")
    assert driver_device(cfg) is None  # local: the policy trains where it lives
    ray = apply_overrides(cfg, ["trainer.backend=ray"])
    assert driver_device(ray) == "cpu"  # only receives the ranks' weights for checkpoints
    assert driver_device(apply_overrides(ray, ["data.eval_files=gsm8k"])) is None  # it decodes: the GPU


def test_a_huge_learning_rate_never_leaves_a_checkpoint_to_resume_from_its_poison(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rl_optim.lr=1e9: one finite update sends the weights to ~1e9, every later step is non-finite.
    # Before, those weights were checkpointed and the rerun resumed from them.
    import dare.quickstart
    from dllm_train import latest_checkpoint, list_checkpoints, read_checkpoint
    from dllm_train.preemption import Diverged
    from tests.dare.helpers import tiny_config
    from tests.tiny_rl import partial_reward

    monkeypatch.setattr(dare.quickstart, "exact_match_reward", partial_reward)  # rewards that differ: a gradient
    cfg = tiny_config("rl_optim.lr=1e9", "trainer.save_every=1", "trainer.max_steps=8", "trainer.keep_checkpoints=8")
    for _ in range(2):  # the run, then its rerun
        with pytest.raises(Diverged, match="steps in a row had a non-finite loss or gradient norm"):
            dare.quickstart.run_quickstart(cfg, tmp_path, progress=False)
        refs = list_checkpoints(tmp_path)
        assert refs and latest_checkpoint(tmp_path) == refs[-1]
        for ref in refs:
            weights, _ = read_checkpoint(ref)
            assert max(float(w.abs().max()) for w in weights.values() if w.is_floating_point()) < 1e3, ref


def test_an_rl_recipe_whose_data_fail_writes_nothing(tiny_checkpoint: Path, sums_parquet: Path,
                                                     tmp_path: Path) -> None:
    # every row is longer than data.max_prompt_length: found only once the prompts were encoded,
    # which ran after config.json was written (the corrected rerun was then refused as "a different config")
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as err:
        main(["train", "llada-d1", f"checkpoint.checkpoint={tiny_checkpoint}", "checkpoint.dtype=float32",
              f"data.train_files={sums_parquet}", "data.max_prompt_length=1", "--output-dir", str(out),
              "--no-progress"])
    assert err.value.code == 2 and not out.exists()


def test_a_diverged_run_ends_in_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #38 "Also": rl_optim.lr=1e9 stopped the run without a poisoned checkpoint but ended in a
    # traceback: the rollout after the poisoning update fails on overflowing logits (stood in for
    # by a decoder that refuses weights above 1e6, as the logits of a larger model overflow)
    import dare.quickstart
    from dllm_rollout import NonFiniteLogits
    from dllm_train import PolicyRank
    from tests.dare.helpers import TINY
    from tests.tiny_rl import partial_reward

    monkeypatch.setattr(dare.quickstart, "exact_match_reward", partial_reward)
    real = PolicyRank.rollout_step

    def overflowing(self: PolicyRank[Any], *args: Any) -> Any:
        if max(float(p.detach().abs().max()) for p in self.rollout.model.parameters()) > 1e6:
            raise NonFiniteLogits("block [8, 12) still has masked positions after 4 steps, more than the 4 it can "
                                  "need: the model's logits are not finite (NaN or inf)")
        return real(self, *args)

    monkeypatch.setattr(PolicyRank, "rollout_step", overflowing)
    with pytest.raises(SystemExit) as err:
        main(["train", *TINY, "rl_optim.lr=1e9", "trainer.save_every=1", "trainer.max_steps=8",
              "--output-dir", str(tmp_path), "--no-progress"])
    assert err.value.code == 2
    lines = [x for x in capsys.readouterr().err.strip().splitlines() if not x[:2].isdigit()]  # not the log lines
    assert len(lines) == 1 and lines[0].startswith("dare: error: rl step ") and "logits were not finite" in lines[0]
    assert "learning rate" in lines[0]
