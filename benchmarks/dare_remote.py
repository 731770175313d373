"""Loading DARE's own SDAR training code from a user's checkout of it, at run time (issue 36, item 6).

`load_dare(root)` imports, from a checkout of yjyddq/DARE (83ae8a3 read for this file), what its
actor runs for `recipe/sdar/run_bgpo_sdar_8b_chat.sh`; nothing of DARE is copied here:

- `models/SDAR-8B-Chat/modeling_sdar.py` (`SDARForCausalLM`, the file `trust_remote_code` loads) and
  its `configuration_sdar.py`, imported as one package so its relative imports resolve;
- `verl/models/transformers/sdar.py` (`apply_sdar_ulysses_patch`: `monkey_patch.py:248-253` applies
  it to every SDAR actor, sequence parallel or not): training attention is
  `torch.compile(flex_attention)` over the actor's `BlockMask` (sdar.py:25,140-150), the head and
  cross entropy only on the noisy targets (sdar.py:219-244);
- `verl/workers/actor/block_diffusion_utils.py` (padding removal, the `[x_t ; x_0]` inputs and their
  BD3LM `BlockMask`) and `verl/utils/seqlen_balancing.py` (`rearrange_micro_batches`).

The `verl` package's own `__init__` (DataProto, tensordict, ray) is not run: `verl`, `verl.utils`,
... are bare package objects over the checkout's folders, so only the files above (and what they
import: `verl/utils/ulysses.py`) execute.

Stand-ins for packages the device may lack, each reported in `Dare.notes`:
- `flash_attn` (modeling_sdar.py:56 imports `flash_attn.ops.triton.layer_norm.rms_norm_fn`
  unconditionally): a float32 RMSNorm in torch (`rms_norm_fn` below); flash-attn's Triton kernel is
  faster, so the peer's norms cost more than DARE's with flash-attn installed (norms are a few % of
  the update's device time, issue 36's profile);
- `einops` (modeling_sdar.py:28; sdar.py:154 uses `rearrange`): the two patterns the files use;
- `liger_kernel` is optional in DARE's file (modeling_sdar.py:65-69): absent, its MLP runs the plain
  `silu(gate) * up` (noted; DARE's requirements.txt pins liger_kernel 0.6.2);
- transformers names a newer transformers dropped (`SlidingWindowCache`,
  `make_flex_block_causal_mask`, ...): placeholders, never called on the training path.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MODEL_DIR = "models/SDAR-8B-Chat"
FILES = (f"{MODEL_DIR}/modeling_sdar.py", f"{MODEL_DIR}/configuration_sdar.py",
         f"{MODEL_DIR}/fused_linear_diffusion_cross_entropy.py", "verl/models/transformers/sdar.py",
         "verl/workers/actor/block_diffusion_utils.py", "verl/utils/seqlen_balancing.py", "verl/utils/ulysses.py")
"""The files of a DARE checkout the peer imports (what a minimal copy must hold)."""
PACKAGE = "dare_sdar_remote"  # the name the modeling folder is imported under (trust_remote_code uses its own)


@dataclasses.dataclass(frozen=True)
class Dare:
    """What the peer update calls of DARE (or, in tests, of a stand-in with the same interface).

    Attributes:
        model_cls: `SDARForCausalLM` (`from_pretrained(folder, config=..., dtype=...)`).
        config_cls: `SDARConfig` (`from_pretrained(folder)`).
        artifacts: `compact_block_diffusion_artifacts(**kwargs)` -> artifacts.
        block_mask: `build_block_diffusion_mask(artifacts, block_size=, block_origin=)`.
        full_tensors: `build_full_block_diffusion_tensors(artifacts)` -> (ids, positions, target
            mask, targets, p_mask) of the `[x_t ; x_0]` row.
        micro_batches: `rearrange_micro_batches(batch, max_token_len, token_cost_multiplier=,
            padded_batch=)` -> (micro-batches, index lists).
        patch: `apply_sdar_ulysses_patch(model)`, or None.
        notes: stand-ins used for absent packages.
    """

    model_cls: Any
    config_cls: Any
    artifacts: Callable[..., Any]
    block_mask: Callable[..., Any]
    full_tensors: Callable[..., Any]
    micro_batches: Callable[..., Any]
    patch: Callable[[Any], None] | None
    notes: tuple[str, ...] = ()


def rms_norm_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-6,
                **_: Any) -> torch.Tensor:
    """RMSNorm of the last dimension in float32 (or wider), `x`'s dtype out (flash-attn's `rms_norm_fn` stand-in)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    h = x.to(wide)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.to(wide)
    if bias is not None:
        h = h + bias.to(wide)
    return h.to(x.dtype)


def rearrange(x: torch.Tensor, pattern: str, **_: Any) -> torch.Tensor:
    """`einops.rearrange` for the patterns DARE's SDAR files use (stand-in when einops is absent)."""
    compact = " ".join(pattern.split())
    if compact == "b h l d -> b l (h d)":
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)
    if compact == "b l h d -> b l (h d)":
        return x.reshape(x.shape[0], x.shape[1], -1)
    raise NotImplementedError(f"einops stand-in: pattern {pattern!r} is not one DARE's SDAR files use; install einops")


def default_rope(config: Any, device: Any = None, seq_len: int | None = None, **_: Any) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim / 2], attention scaling 1.0) of plain RoPE: transformers 4's
    "default" entry of ROPE_INIT_FUNCTIONS, which DARE's SDARRotaryEmbedding looks up."""
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    dim = int(dim * float(getattr(config, "partial_rotary_factor", 1.0)))
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (float(config.rope_theta) ** exponent), 1.0


def config_defaults(config: Any) -> list[str]:
    """Give `config` the attributes transformers 4 set on every config and DARE's model reads
    (transformers 5 dropped `pad_token_id` from the base class); what was set."""
    set_: list[str] = []
    for name in ("pad_token_id",):
        try:
            getattr(config, name)
        except AttributeError:
            setattr(config, name, None)
            set_.append(f"config.{name}=None (transformers 4's default; transformers 5 has none)")
    return set_


def restore_rope_buffers(model: torch.nn.Module) -> list[str]:
    """Recompute each rotary module's `inv_freq` as DARE's `SDARRotaryEmbedding.__init__` does
    (modeling_sdar.py:748-755); what was restored.

    transformers 5 builds a model on the meta device and fills only the checkpoint's tensors and what
    `_init_weights` covers: DARE's `_init_weights` predates that and never sets the non-persistent
    `inv_freq`, which is then left uninitialised memory (NaN or garbage rotations).
    """
    notes: list[str] = []
    for name, mod in model.named_modules():
        if not (hasattr(mod, "rope_init_fn") and isinstance(getattr(mod, "inv_freq", None), torch.Tensor)):
            continue
        old = mod.inv_freq
        inv, scaling = mod.rope_init_fn(mod.config, old.device)
        mod.register_buffer("inv_freq", inv.to(old.device), persistent=False)
        mod.original_inv_freq = mod.inv_freq
        mod.attention_scaling = scaling
        if old.shape != inv.shape or not torch.equal(old.cpu(), inv.cpu()):
            notes.append(f"{name}.inv_freq recomputed as DARE's __init__ does (transformers 5 left it uninitialised)")
    return notes


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


FLASH_STANDIN = ("flash_attn", "flash_attn.ops", "flash_attn.ops.triton", "flash_attn.ops.triton.layer_norm")


def install_standins() -> list[str]:
    """Register stand-ins for the packages DARE's files import that are absent; what was stood in.

    The flash_attn stand-in lives in `sys.modules` only while DARE's files import (`remove_flash_standin`
    after): transformers asks `importlib.util.find_spec("flash_attn")`, which a bare module would break.
    """
    notes: list[str] = []
    import transformers.modeling_utils  # noqa: F401  (its flash-attn availability checks run before the stand-in)

    if importlib.util.find_spec("flash_attn") is None:
        for name in FLASH_STANDIN[:-1]:
            sys.modules[name] = _module(name, __path__=[])
        sys.modules[FLASH_STANDIN[-1]] = _module(FLASH_STANDIN[-1], rms_norm_fn=rms_norm_fn)
        notes.append("flash_attn absent: rms_norm_fn is a float32 torch RMSNorm (DARE's RMSNorm calls flash-attn's "
                     "Triton kernel); attention is flex either way")
    if importlib.util.find_spec("liger_kernel") is None:  # optional in DARE's file (modeling_sdar.py:65-69)
        notes.append("liger_kernel absent: DARE's MLP runs its plain silu(gate) * up (DARE's requirements.txt pins "
                     "liger_kernel 0.6.2, whose fused SiLU-mul it would use)")
    if importlib.util.find_spec("einops") is None:
        sys.modules["einops"] = _module("einops", rearrange=rearrange)
        notes.append("einops absent: rearrange stand-in (the two reshapes DARE's SDAR files use)")
    import transformers.cache_utils as cache_utils

    for missing in ("SlidingWindowCache", "StaticCache", "DynamicCache", "Cache"):
        if not hasattr(cache_utils, missing):
            setattr(cache_utils, missing, type(missing, (), {}))
            notes.append(f"transformers.cache_utils.{missing} absent: placeholder class (not on the training path)")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "default" not in ROPE_INIT_FUNCTIONS:
        ROPE_INIT_FUNCTIONS["default"] = default_rope
        notes.append("transformers ROPE_INIT_FUNCTIONS has no 'default' (transformers 5): plain RoPE inverse frequencies")
    try:
        import transformers.integrations.flex_attention as hf_flex

        if not hasattr(hf_flex, "make_flex_block_causal_mask"):
            setattr(hf_flex, "make_flex_block_causal_mask", None)  # noqa: B010
            notes.append("transformers make_flex_block_causal_mask absent: placeholder (not on the training path)")
    except ImportError:
        pass
    return notes


def remove_flash_standin() -> None:
    """Take the flash_attn stand-in out of `sys.modules` (DARE's module keeps the `rms_norm_fn` it bound)."""
    for name in FLASH_STANDIN:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__spec__", None) is None:
            del sys.modules[name]


def check_root(root: Path) -> None:
    """Raise a ValueError naming the files a DARE checkout at `root` lacks."""
    missing = [f for f in FILES if not (root / f).is_file()]
    if missing:
        raise ValueError(f"--dare-root={root}: not a checkout of yjyddq/DARE (83ae8a3): missing {missing}; "
                         "pass the folder of a clone (git clone https://github.com/yjyddq/DARE) or a copy of these files")


def _bare_packages(root: Path) -> None:
    """`verl`, `verl.utils`, ... as package objects over `root`'s folders, without running their `__init__`."""
    for dotted in ("verl", "verl.utils", "verl.models", "verl.models.transformers", "verl.workers",
                   "verl.workers.actor"):
        folder = root / Path(*dotted.split("."))
        existing = sys.modules.get(dotted)
        if existing is not None and list(getattr(existing, "__path__", [])) == [str(folder)]:
            continue
        sys.modules[dotted] = _module(dotted, __path__=[str(folder)], __package__=dotted)
    for name in ("verl.utils.ulysses", "verl.utils.seqlen_balancing", "verl.models.transformers.sdar",
                 "verl.workers.actor.block_diffusion_utils"):
        sys.modules.pop(name, None)


def _model_package(folder: Path) -> types.ModuleType:
    """The modeling folder imported as package `PACKAGE` (its relative imports resolve inside it)."""
    spec = importlib.util.spec_from_file_location(PACKAGE, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    assert spec is not None
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = pkg  # no __init__.py in the release folder: an empty package body
    for sub in ("configuration_sdar", "fused_linear_diffusion_cross_entropy", "modeling_sdar"):
        sys.modules.pop(f"{PACKAGE}.{sub}", None)
    return pkg


def dense_flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: Any = None,
                         scale: float | None = None, enable_gqa: bool = False, **_: Any) -> torch.Tensor:
    """sdpa over the dense mask of `block_mask.mask_mod`: the function flex attention computes, with a
    backward on the CPU (torch's flex has none there). For CPU checks of DARE's path only."""
    from torch.nn.attention.flex_attention import create_mask

    b, lq = query.shape[0], query.shape[2]
    dense = create_mask(block_mask.mask_mod, b, None, lq, key.shape[2], device=query.device)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=dense, scale=scale,
                                                            enable_gqa=enable_gqa)


def load_dare(root: Path, *, cpu_attention: bool = False) -> Dare:
    """DARE's SDAR model class, actor helpers and patch, imported from the checkout at `root`.

    With `cpu_attention`, the patch's CPU branch (sdar.py:140-142: eager `flex_attention` off CUDA)
    runs `dense_flex_attention`, since flex attention has no CPU backward (tiny CPU checks).

    Raises:
        ValueError: `root` lacks one of `FILES`.
    """
    root = Path(root).resolve()
    check_root(root)
    notes = install_standins()
    _bare_packages(root)
    _model_package(root / MODEL_DIR)
    try:
        modeling = importlib.import_module(f"{PACKAGE}.modeling_sdar")
    finally:
        remove_flash_standin()
    configuration = importlib.import_module(f"{PACKAGE}.configuration_sdar")
    bd = importlib.import_module("verl.workers.actor.block_diffusion_utils")
    balancing = importlib.import_module("verl.utils.seqlen_balancing")
    sdar_patch = importlib.import_module("verl.models.transformers.sdar")
    if cpu_attention:
        setattr(sdar_patch, "flex_attention", dense_flex_attention)  # noqa: B010
        notes.append("CPU: flex attention has no backward there; sdpa over the dense mask of DARE's mask_mod")
    return Dare(model_cls=modeling.SDARForCausalLM, config_cls=configuration.SDARConfig,
                artifacts=bd.compact_block_diffusion_artifacts, block_mask=bd.build_block_diffusion_mask,
                full_tensors=bd.build_full_block_diffusion_tensors, micro_batches=balancing.rearrange_micro_batches,
                patch=sdar_patch.apply_sdar_ulysses_patch, notes=tuple(notes))


def copy_files(root: Path, target: Path) -> list[Path]:
    """Copy `FILES` of the DARE checkout at `root` to the same paths under `target` (a minimal checkout
    to carry to a machine without DARE, e.g. the git-ignored `.dare_ref/`); the copies."""
    check_root(root)
    out = []
    for name in FILES:
        dst = target / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, dst)
        out.append(dst)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy the files of a DARE checkout the peer update imports.")
    ap.add_argument("root", type=Path, help="a checkout of yjyddq/DARE")
    ap.add_argument("target", type=Path, nargs="?", default=Path(".dare_ref"), help="default .dare_ref (git-ignored)")
    args = ap.parse_args(argv)
    for path in copy_files(args.root, args.target):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
