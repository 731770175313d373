"""The two dimensions of a run's ranks: data parallel (rows) x sequence parallel (positions).

`world_size = data_parallel * sequence_parallel`. Ranks are laid out sequence-parallel fastest:
the `sequence_parallel` consecutive ranks [d S, (d + 1) S) form sequence-parallel group d, which
holds rows [d B/D, (d + 1) B/D) of a batch of B rows (D = data_parallel). FSDP2 shards weights and
averages gradients over all of them (see `SequenceParallelScorer` for why that is exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from dllm_train.config import check_sequence_parallel


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Sizes of the rank grid.

    Attributes:
        world_size: number of ranks.
        sequence_parallel: ranks that split every sequence of one data-parallel group (1: none).
    """

    world_size: int
    sequence_parallel: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        check_sequence_parallel(self.sequence_parallel, self.world_size)

    @property
    def data_parallel(self) -> int:
        """Number of data-parallel groups (each holds its own rows)."""
        return self.world_size // self.sequence_parallel

    def dp_rank(self, rank: int) -> int:
        """The data-parallel group of `rank`."""
        return rank // self.sequence_parallel

    def sp_rank(self, rank: int) -> int:
        """The position of `rank` inside its sequence-parallel group (0: the group's leader)."""
        return rank % self.sequence_parallel

    def sp_ranks(self, dp_rank: int) -> list[int]:
        """The global ranks of sequence-parallel group `dp_rank`."""
        return list(range(dp_rank * self.sequence_parallel, (dp_rank + 1) * self.sequence_parallel))


def sequence_parallel_group(dims: ParallelDims, rank: int) -> dist.ProcessGroup | None:
    """This rank's sequence-parallel process group (None when sequence_parallel is 1).

    A collective: every rank creates every group, in the same order.
    """
    if dims.sequence_parallel == 1:
        return None
    if dims.data_parallel == 1:
        return dist.group.WORLD
    own = None
    for d in range(dims.data_parallel):
        group = dist.new_group(dims.sp_ranks(d))
        if d == dims.dp_rank(rank):
            assert isinstance(group, dist.ProcessGroup)
            own = group
    return own


__all__ = ["ParallelDims", "sequence_parallel_group"]
