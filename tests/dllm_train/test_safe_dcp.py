"""Sharded (DCP) checkpoints resume without unpickling anything but DCP's metadata and plain data
(issue #38 T7: `.metadata` was `pickle.load`ed and non-tensor items read with weights_only=False)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from dllm_train.distributed.fsdp import load_sharded_state, save_sharded_state


class _Payload:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (print, ("unpickled: code ran",))


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture(autouse=True)
def _single_process() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def test_a_sharded_state_round_trips_through_the_safe_reader(tmp_path: Path) -> None:
    model, opt = _trained(0)
    save_sharded_state(model, opt, str(tmp_path))
    other, other_opt = _trained(1)
    load_sharded_state(other, other_opt, str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert other_opt.state_dict()["param_groups"][0]["lr"] == 1e-2
    exp = [s["exp_avg"] for s in opt.state_dict()["state"].values()]
    assert all(torch.equal(a, s["exp_avg"]) for a, s in zip(exp, other_opt.state_dict()["state"].values()))


def test_forged_metadata_is_refused_without_running_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, opt = _trained(0)
    save_sharded_state(model, opt, str(tmp_path))
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Payload()))
    # DCP's load wraps the reader's ValueError into its CheckpointException, which keeps the message
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    with pytest.raises(CheckpointException) as err:
        load_sharded_state(model, opt, str(tmp_path))
    text = f"{err.value} {err.value.__cause__} {getattr(err.value, 'failures', '')}"
    assert ".metadata holds objects other than checkpoint metadata (builtins.print" in text, text
    assert "code ran" not in capsys.readouterr().out


def test_a_forged_plain_item_is_refused_without_running_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # non-tensor items (the optimizer's param_groups entries) are torch.save'd bytes in the shards
    from dllm_train.distributed.safe_dcp import SafeLoadPlanner
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem
    import io

    buf = io.BytesIO()
    torch.save({"lr": _Payload()}, buf)
    buf.seek(0)
    item = ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex("optimizer.param_groups.lr"),
                    dest_offsets=torch.Size([0]), storage_index=MetadataIndex("x"), storage_offsets=torch.Size([0]),
                    lengths=torch.Size([0]))
    planner = SafeLoadPlanner()
    planner.flatten_state_dict = False
    planner.state_dict = {}
    with pytest.raises(ValueError, match="optimizer.param_groups.lr holds objects other than tensors"):
        planner.load_bytes(item, buf)
    assert "code ran" not in capsys.readouterr().out
