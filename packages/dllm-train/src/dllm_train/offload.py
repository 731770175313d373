"""Optimizer-state offload: the state waits in host memory while the device needs the room.

AdamW's two moments (twice the weights in bf16) are read only by `optimizer.step()`, yet they
would sit on the device through the rollout's KV cache and the training passes' activations.
`HostOffload.offload` copies the bytes of every device-resident state tensor into one flat host
buffer (pinned with CUDA, reused from step to step) and frees the device storage in place
(`untyped_storage().resize_(0)`): the tensor objects, and so the optimizer's state dict holding
them, keep their identity. `HostOffload.restore` gives each storage its bytes back and copies them
in. A DTensor's state (FSDP2) is offloaded through its local shard, which shares its storage.

`OptimizerStep` (`dllm_train.optim`) restores before anything reads the state: the AdamW update,
`state()` and `load_state()`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

DEVICES = ("cuda",)
"""The device types whose tensors `HostOffload` moves (tests add "cpu" to run it without a GPU)."""
ALIGN_BYTES = 64
"""Each storage's bytes start at a multiple of this offset in the host buffer."""


def state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor of `optimizer`'s per-parameter state (AdamW: `exp_avg`, `exp_avg_sq`, `step`);
    of a DTensor, its local shard (the same storage)."""
    from torch.distributed.tensor import DTensor  # here: 3 s of imports the CLI's cheap commands skip

    out = []
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, DTensor):
                value = value.to_local()
            if isinstance(value, torch.Tensor):
                out.append(value)
    return out


@dataclass(frozen=True)
class _Slot:
    """One freed storage and where its bytes wait: `buffer[offset:offset + nbytes]`."""

    storage: torch.UntypedStorage
    offset: int
    nbytes: int


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over all of `storage` (any dtype, view or layout copies exactly)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _synchronize(slots: Sequence[_Slot]) -> None:
    for device in {s.storage.device for s in slots if s.storage.device.type == "cuda"}:
        torch.cuda.synchronize(device)


class HostOffload:
    """Tensors' bytes in one host buffer while their device storage is freed, and back.

    Args:
        devices: the device types whose tensors are moved; tensors elsewhere stay (AdamW's `step`
            counters live on the CPU). Production code keeps `DEVICES`.
    """

    def __init__(self, *, devices: Sequence[str] = DEVICES) -> None:
        self.devices = tuple(devices)
        self.buffer: torch.Tensor | None = None
        self.layout: tuple[int, ...] = ()
        self.slots: list[_Slot] = []

    @property
    def offloaded(self) -> bool:
        """Whether storages wait in the buffer (until `restore`)."""
        return bool(self.slots)

    def offload(self, tensors: Iterable[torch.Tensor]) -> int:
        """Copy the storage of each tensor on `devices` into the host buffer, then free it in place.

        The copies run asynchronously and are waited for once, before any storage is freed; the
        device's cached blocks are then released, so a large allocation can take them. A no-op
        while already offloaded (nothing can have added state since: each reader restores first).

        Returns:
            the bytes moved.
        """
        if self.slots:
            return 0
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            storage = t.untyped_storage()
            if t.device.type in self.devices and storage.nbytes() > 0:
                storages.setdefault(storage.data_ptr(), storage)  # tensors sharing a storage move it once
        slots, end = [], 0
        for storage in storages.values():
            slots.append(_Slot(storage, end, storage.nbytes()))
            end += -(-storage.nbytes() // ALIGN_BYTES) * ALIGN_BYTES
        if not slots:
            return 0
        layout = tuple(s.nbytes for s in slots)
        if self.buffer is None or layout != self.layout:
            self.buffer = None  # the old buffer goes before the new one is pinned
            self.buffer = torch.empty(end, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            self.layout = layout
        for s in slots:
            self.buffer[s.offset:s.offset + s.nbytes].copy_(_as_bytes(s.storage), non_blocking=True)
        _synchronize(slots)
        for s in slots:
            s.storage.resize_(0)
        self.slots = slots
        if any(s.storage.device.type == "cuda" for s in slots):
            torch.cuda.empty_cache()
        return sum(layout)

    def restore(self) -> float:
        """Give every freed storage its bytes back (the same tensor objects); a no-op unless offloaded.

        The copies are queued on the current stream, the one that reads them next, and waited for
        once, so the seconds returned are theirs.

        Returns:
            the seconds the copies took.
        """
        if not self.slots:
            return 0.0
        assert self.buffer is not None
        start = time.perf_counter()
        for s in self.slots:
            s.storage.resize_(s.nbytes)
            _as_bytes(s.storage).copy_(self.buffer[s.offset:s.offset + s.nbytes], non_blocking=True)
        _synchronize(self.slots)
        self.slots = []
        return time.perf_counter() - start


__all__ = ["ALIGN_BYTES", "DEVICES", "HostOffload", "state_tensors"]
