"""Group agreement for ranks whose forward passes are collectives: `group_max` and `group_all`.

Under FSDP2 every forward all-gathers the weights of each sharded block and every backward
reduce-scatters their gradients, so all ranks of the group must run the same sequence of forward
and backward passes, or the ones that run more wait forever. An objective whose number of passes
depends on the data (replayed trajectory states, chunks of positions) takes the group's largest
count (`group_max`, in `dllm_train.passes`) and runs its missing passes as `Scorer.idle_pass`:
one forward of a one-token input whose value is exactly 0, so its backward runs the same
collectives and adds exactly zero to every gradient (the update equals the one without padding).

A `Scorer` built without a `lockstep_group` (one process, or ranks whose forwards are not
collectives) never communicates: `group_max` returns the count unchanged. The optimizer step uses
`group_all` so that every rank skips a non-finite step together.
"""

from __future__ import annotations

import torch
import torch.distributed as dist



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


__all__ = ["group_all", "group_max"]
