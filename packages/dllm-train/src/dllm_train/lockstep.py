"""Lockstep passes: ranks whose forward passes are collectives run the same number of them.

Under FSDP2 every forward all-gathers the weights of each sharded block and every backward
reduce-scatters their gradients, so all ranks of the group must run the same sequence of forward
and backward passes, or the ones that run more wait forever. An objective whose number of passes
depends on the data (replayed trajectory states, chunks of positions) asks `lockstep_passes` for
the group's largest count and runs its missing passes as `Scorer.idle_pass`: one forward of a
one-token input whose value is exactly 0, so its backward runs the same collectives and adds
exactly zero to every gradient (the update equals the one without padding).

A `Scorer` built without a `lockstep_group` (one process, or ranks whose forwards are not
collectives) never communicates: `lockstep_passes` returns the count unchanged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from dllm_train.likelihood import Scorer


def group_max(value: int, group: dist.ProcessGroup | None) -> int:
    """The largest `value` over the ranks of `group` (`value` itself when `group` is None); a collective."""
    if group is None:
        return value
    # nccl reduces CUDA tensors only (the current device is this rank's, see `init_process_group`)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def group_all(flag: bool, group: dist.ProcessGroup | None) -> bool:
    """Whether `flag` holds on every rank of `group` (`flag` itself when `group` is None); a collective."""
    return flag if group is None else not group_max(int(not flag), group)


def lockstep_passes(scorer: Scorer, num_passes: int) -> int:
    """How many passes to run when this rank needs `num_passes`: the largest need of the scorer's group.

    Call it before the first of the passes (it is a collective itself, which must not meet
    another rank's forward). Passes k >= `num_passes` are this rank's padding: run
    `scorer.idle_pass()` for them (and, in an update, backward its zero value), so every rank
    runs the same collectives.

    Args:
        scorer: the scorer running the passes (its `lockstep_group` is the group that must agree).
        num_passes: passes this rank's rows need.

    Returns:
        max over the group of `num_passes` (`num_passes` without a group); a collective.
    """
    return group_max(num_passes, scorer.lockstep_group)


__all__ = ["group_all", "group_max", "lockstep_passes"]
