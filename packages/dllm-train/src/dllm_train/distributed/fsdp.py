"""FSDP2 wrapping and full-weight hand-off: a thin shell around a plain model.

`shard_model` applies `torch.distributed.fsdp.fully_shard` to every transformer block and then to
the root (Zhao et al., "PyTorch FSDP", arXiv 2304.11277; FSDP2 = per-parameter DTensor sharding).
Gradients are reduce-scattered and averaged over the data-parallel group, so ranks that each see
B/N samples of a batch whose loss is a per-sample (or equal-count token) mean produce the
full-batch update.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def free_port() -> int:
    """An unused TCP port on this host (for the rendezvous of a new process group)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def init_process_group(*, rank: int, world_size: int, master_addr: str, master_port: int,
                       backend: str, timeout_s: float = 600.0) -> None:
    """Join the default process group (gloo on CPU, nccl on GPU), rendezvous over TCP."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"process-group backend {backend!r} unknown; choose 'gloo' (CPU) or 'nccl' (GPU)")
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port),
                      RANK=str(rank), WORLD_SIZE=str(world_size))
    if backend == "nccl":
        torch.cuda.set_device(0 if torch.cuda.device_count() == 1 else rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a dllm_models family (`transformer.blocks` or `model.layers`)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("blocks", "layers"):
            return list(module)
    raise ValueError(f"{type(model).__name__} has no `blocks`/`layers` ModuleList to shard per block")


@torch.no_grad()
def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers to every rank (call before sharding)."""
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=src)


def shard_model(model: nn.Module, *, param_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype | None = torch.float32,
                reshard_after_forward: bool = True, cpu_offload: bool = False) -> nn.Module:
    """FSDP2-shard `model` in place: each transformer block, then the root (embeddings, head).

    Args:
        model: an unsharded model, identical on every rank, on this rank's device.
        param_dtype: compute dtype of gathered parameters (e.g. torch.bfloat16); None keeps
            the stored dtype (fp32 on CPU tests).
        reduce_dtype: dtype of the gradient reduce-scatter.
        reshard_after_forward: free gathered block weights after forward (ZeRO-3 style).
        cpu_offload: keep sharded parameters, gradients and optimizer state on the CPU
            (`CPUOffloadPolicy`); each block's weights move to the device for its compute.

    Returns:
        the same module object (its parameters are now DTensors sharded on dim 0).

    Parameters a rank's backward leaves without a gradient (the experts no token of its rows
    picked, in the MoE families) are reduce-scattered as zeros: without that, ranks whose rows
    pick different experts reduce-scatter buffers of different sizes (gloo aborts, nccl may hang).
    A parameter no rank used then gets a zero gradient instead of none (AdamW still applies its
    momentum to it, where one process would skip it).
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    extra: dict[str, Any] = {}
    if cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        extra["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())  # pinning needs CUDA
    for block in transformer_blocks(model):
        fully_shard(block, mp_policy=mp, reshard_after_forward=reshard_after_forward, **extra)
    # the root (embeddings, final norm, head) stays gathered: backward starts with the head
    fully_shard(model, mp_policy=mp, reshard_after_forward=False, **extra)
    if hasattr(model, "final_hidden"):
        # the fused log-prob head of the packed likelihood path runs `final_hidden`, not `forward`:
        # it must gather the root's weights too (the head weight then stays gathered, as above)
        from torch.distributed.fsdp import register_fsdp_forward_method

        register_fsdp_forward_method(model, "final_hidden")
    unused_as_zeros = getattr(model, "set_reduce_scatter_unused_params", None)  # absent in older torch
    if unused_as_zeros is not None:
        unused_as_zeros(True)
    return model


def full_state_dict(model: nn.Module, *, cpu: bool = False) -> dict[str, Any]:
    """Unsharded weights of an FSDP2 model.

    With `cpu=False` every rank gets full tensors on its device (rollout hand-off); with
    `cpu=True` only rank 0 gets them, on CPU (checkpoints; other ranks get {}).
    """
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu))


def load_full_state_dict(model: nn.Module, state: dict[str, Any]) -> None:
    """Load unsharded weights into an FSDP2 model; a collective.

    Args:
        state: the full state dict on rank 0 (any device; other ranks may pass {}): rank 0
            broadcasts it and every rank keeps its shard.
    """
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) values of the trainable parameters only, on every rank; a collective.

    With LoRA adapters (`dllm_models.apply_lora`) these are the adapter weights: the frozen base
    weights are never gathered.
    """
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            value = p.detach()
            out[name] = value.full_tensor() if isinstance(value, DTensor) else value
    return out


def handoff_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights a rollout replica needs after an update; a collective.

    Only the trainable parameters when some are frozen (LoRA adapters: the adapter weights, as
    `RolloutWorker.load_weights` accepts), else the full state dict.
    """
    if all(p.requires_grad for p in model.parameters()):
        return full_state_dict(model)
    return trainable_state_dict(model)


def save_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    """Write this rank's shards of the parameters (FSDP2's own, e.g. float32 masters) and of the
    optimizer state to `folder` (`torch.distributed.checkpoint`); a collective.

    Nothing is gathered: every rank writes its own files in parallel, a tensor at a time, so
    neither host memory nor any one process holds the full optimizer state. `folder` must be one
    folder that every rank can reach.
    """
    from torch.distributed.checkpoint.state_dict_saver import save

    model_state, optim_state = get_state_dict(model, optimizer)
    save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    """Inverse of `save_sharded_state` (any number of ranks: DCP reshards); a collective. Nothing is
    unpickled beyond DCP's metadata classes and plain data (`safe_dcp`)."""
    from torch.distributed.checkpoint.state_dict_loader import load

    from dllm_train.distributed.safe_dcp import SafeLoadPlanner, SafeReader

    model_state, optim_state = get_state_dict(model, optimizer)
    load({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder,  # in place
         storage_reader=SafeReader(folder), planner=SafeLoadPlanner())
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                              state: dict[str, Any]) -> None:
    """Load rank 0's full optimizer state into every rank's shard."""
    set_optimizer_state_dict(model, optimizer, state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


__all__ = [
    "broadcast_parameters",
    "free_port",
    "full_state_dict",
    "handoff_state_dict",
    "init_process_group",
    "load_full_optimizer_state",
    "load_full_state_dict",
    "load_sharded_state",
    "save_sharded_state",
    "shard_model",
    "trainable_state_dict",
    "transformer_blocks",
]
