"""Activation checkpointing sized to memory: recompute only as many decoder layers as a budget needs.

Full activation checkpointing (every decoder layer recomputed in backward) costs about one more
forward per training pass; keeping every layer's activations costs L times a layer's. Between
the two, checkpointing the first c layers of a pass keeps (L - c) layers' activations and, for
the c others, only their inputs. The memory model, per training forward of T tokens:

    peak ~ used + (L - c) * A + c * K + (A if c > 0) + reserve

where `used` is what the device holds when the forward starts (weights, gradients, optimizer
state, the batch), A the bytes one layer saves for its backward, K the bytes a checkpointed
layer keeps (its input, T x H), the extra A the recompute of one checkpointed layer in backward,
and `reserve` a fixed headroom for what the model does not see (the log-prob head's chunks,
backward temporaries, allocator fragmentation). c is the smallest count with peak <= budget
(`layers_to_checkpoint`), L when none fits.

A is *measured*, not modelled: on CUDA as the growth of allocated memory across a layer run
without checkpointing, on the CPU as the bytes of the tensors autograd saves (a saved-tensor
hook, parameters excluded). It is linear in the tokens (no attention backend here saves an
N x N matrix on the GPU), so it is kept as bytes per token (the largest seen: MoE layers vary)
and scaled to each pass. The first training forward of a model (of at least
`min_measure_tokens`) runs its first layer without checkpointing to measure it. Layers are decided in order, each against the memory in use at
that point (CUDA: the allocator's count; CPU: the measured bytes), so a pass checkpoints a
prefix of its layers. Gradients are those of full checkpointing: recomputation is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, TypeVar

import torch

GIB = 1 << 30
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ActivationBudget:
    """The memory a training forward may fill, for `ActivationPlanner`.

    Attributes:
        budget_bytes: the device memory the whole step may use (weights and optimizer included);
            None: the device's total memory on CUDA, and full checkpointing elsewhere (no limit
            to size against).
        reserve_bytes: headroom kept free under the budget (see the module doc).
        min_measure_tokens: only forwards of at least this many tokens measure a layer (a
            one-token idle pass would overstate the bytes per token: allocations round up);
            smaller ones checkpoint every layer until a measure exists.
    """

    budget_bytes: int | None = None
    reserve_bytes: int = 4 * GIB
    min_measure_tokens: int = 256

    def __post_init__(self) -> None:
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0 (or None: the device's memory), got {self.budget_bytes}")
        if self.reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be >= 0, got {self.reserve_bytes}")
        if self.min_measure_tokens < 1:
            raise ValueError(f"min_measure_tokens must be >= 1, got {self.min_measure_tokens}")

    def limit(self, device: torch.device) -> int | None:
        """Bytes the step may use on `device` (None: unknown, checkpoint every layer)."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        if device.type == "cuda":
            return int(torch.cuda.get_device_properties(device).total_memory)
        return None


def layers_to_checkpoint(num_layers: int, layer_bytes: float, kept_bytes: float, free_bytes: float) -> int:
    """Smallest c in [0, L] with (L - c) * A + c * K + (A if c > 0) <= free, or L when none is.

    Args:
        num_layers: L, the layers still to run.
        layer_bytes: A, bytes one layer saves for backward.
        kept_bytes: K, bytes a checkpointed layer keeps.
        free_bytes: what the budget leaves (budget - used - reserve).
    """
    for c in range(num_layers + 1):
        need = (num_layers - c) * layer_bytes + c * kept_bytes + (layer_bytes if c > 0 else 0.0)
        if need <= free_bytes:
            return c
    return num_layers


@contextmanager
def _saved_bytes(module: torch.nn.Module, out: list[int]) -> Iterator[None]:
    """Sum into out[0] the bytes of the distinct non-parameter storages autograd saves inside."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            out[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


class ActivationPlanner:
    """Decides, layer by layer, which layers of a training forward to checkpoint (see the module doc).

    Set as `model.activation_planner` (with `model.gradient_checkpointing = True`); the families'
    decoder stack (`families.backbone.run_layers`) asks it once per layer.

    Attributes:
        budget: the memory budget.
        bytes_per_token: measured bytes a layer saves per token (None until the first measure).
        last_checkpointed: layers checkpointed by the latest training forward.
    """

    def __init__(self, budget: ActivationBudget) -> None:
        self.budget = budget
        self.bytes_per_token: float | None = None
        self.last_checkpointed = 0

    def run(self, layers: list[torch.nn.Module], x: torch.Tensor,
            call: Callable[[int, torch.Tensor, bool], tuple[torch.Tensor, T]]) -> tuple[torch.Tensor, list[T]]:
        """Run `call(i, x, checkpointed) -> (x, extra)` for every layer i, deciding `checkpointed`.

        Returns:
            the last hidden states and each layer's extra output.
        """
        extras: list[T] = []
        if not torch.is_grad_enabled():  # nothing is saved for a backward: no layer to checkpoint or measure
            for i in range(len(layers)):
                x, extra = call(i, x, False)
                extras.append(extra)
            return x, extras
        device = x.device
        limit = self.budget.limit(device)
        tokens = x.shape[0] * x.shape[1]
        kept = x.numel() * x.element_size()
        held = 0  # CPU: bytes this forward has saved so far
        checkpointed = 0
        for i, layer in enumerate(layers):
            if limit is None:
                ckpt = True
            elif self.bytes_per_token is None:  # the first layer of the first large forward is measured
                ckpt = tokens < self.budget.min_measure_tokens
            else:
                used = torch.cuda.memory_allocated(device) if device.type == "cuda" else held
                free = limit - used - self.budget.reserve_bytes
                ckpt = layers_to_checkpoint(len(layers) - i, self.bytes_per_token * tokens, kept, free) > 0
            if ckpt:
                x, extra = call(i, x, True)
                held += kept
                checkpointed += 1
            else:
                x, extra, saved = self._measured(layer, i, x, call)
                held += saved
                if saved > 0 and tokens >= self.budget.min_measure_tokens:
                    self.bytes_per_token = max(self.bytes_per_token or 0.0, saved / max(tokens, 1))
            extras.append(extra)
        self.last_checkpointed = checkpointed
        return x, extras

    @staticmethod
    def _measured(layer: torch.nn.Module, i: int, x: torch.Tensor,
                  call: Callable[[int, torch.Tensor, bool], tuple[torch.Tensor, T]]) -> tuple[torch.Tensor, T, int]:
        """(x, extra, bytes the layer keeps for backward) of one layer run without checkpointing."""
        if x.device.type == "cuda":
            before = torch.cuda.memory_allocated(x.device)
            out, extra = call(i, x, False)
            return out, extra, max(0, torch.cuda.memory_allocated(x.device) - before)
        box = [0]
        with _saved_bytes(layer, box):
            out, extra = call(i, x, False)
        return out, extra, box[0]


def planner_of(model: Any) -> ActivationPlanner | None:
    """`model.activation_planner` when it is one (None: checkpoint every layer, as before)."""
    planner = getattr(model, "activation_planner", None)
    return planner if isinstance(planner, ActivationPlanner) else None


__all__ = ["GIB", "ActivationBudget", "ActivationPlanner", "layers_to_checkpoint", "planner_of"]
