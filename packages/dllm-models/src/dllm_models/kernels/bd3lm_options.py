"""How the BD3LM attention kernel runs: its tiles and its backward variant (`BD3LMKernelOptions`).

The backward variants (all exact; they differ in how the work is cut into programs):

- `split`: FlashAttention-2's split (Dao, arXiv 2307.08691): one dK/dV program per (KV head,
  key tile) walking every query tile that sees the key tile for each of the KV head's grouped
  query heads, then a second launch with one dQ program per (query head, query tile).
- `one_launch`: the same programs in one grid, dK/dV first (longest walk first), dQ behind them,
  as the backward of FlexAttention's template (Dong et al., arXiv 2412.05496): the dQ programs
  fill the multiprocessors the few long dK/dV walks leave idle.
- `chunked`: `one_launch` with each dK/dV walk cut into pieces of at most `dkdv_chunk` query
  tiles, each its own program, summed into float32 dK/dV by atomic adds. In the shared-clean
  layout the clean key tiles are seen by every copy's queries (the first one by all N of them)
  while a noisy key tile is seen by one or two query tiles: whole walks leave a few programs
  with most of the work.
- `fused`: `chunked` whose dK/dV programs also add their dQ contributions by float32 atomic adds
  (FlashAttention-3, Shah et al., arXiv 2407.08608): no dQ programs, so q k^T and dO v^T are
  computed once instead of twice, at the price of the atomic traffic.

`chunked` and `fused` add float32 partial sums in whatever order the programs finish: exact up to
rounding, but not bitwise repeatable from run to run; `split` and `one_launch` are.

Measured on one H200 (docs/benchmarks.md, SDAR-8B's shape, 16,384 positions, forward + backward):
`one_launch` 4.44 ms, `chunked` 4.45, `fused` 4.76, `split` 5.19, flex 5.72. `one_launch`, the
fastest and bitwise repeatable, is the default.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKWARD_VARIANTS = ("split", "one_launch", "chunked", "fused")


@dataclass(frozen=True)
class Tile:
    """One kernel's tile: queries (BLOCK_M) and keys (BLOCK_N) per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            size = getattr(self, name)
            if size < 16 or size & (size - 1):
                raise ValueError(f"Tile.{name}={size}: tensor-core tiles need a power of two >= 16 (e.g. 64)")
        if self.warps not in (1, 2, 4, 8, 16) or self.stages < 1:
            raise ValueError(f"Tile(warps={self.warps}, stages={self.stages}): warps a power of two <= 16, "
                             "stages >= 1")

    @classmethod
    def parse(cls, text: str) -> Tile:
        """`Tile` from 'MxNwWsS' (e.g. '64x128w8s2'; warps and stages optional: '64x128')."""
        try:
            sizes, _, rest = text.partition("w")
            m, n = (int(x) for x in sizes.split("x"))
            warps, _, stages = rest.partition("s")
            return cls(m, n, int(warps) if warps else 4, int(stages) if stages else 2)
        except ValueError as err:
            if "Tile" in str(err):
                raise
            raise ValueError(f"tile {text!r}: expected 'MxNwWsS', e.g. '64x128w8s2'") from err


@dataclass(frozen=True)
class Tiling:
    """The tiles of the forward, the dK/dV programs and the dQ programs (each walks its own schedule).

    In the single-launch backward variants the dK/dV tile's warps and stages apply to the whole
    launch (one compiled kernel holds both programs).
    """

    forward: Tile
    dkdv: Tile
    dq: Tile

    def tiles(self) -> tuple[Tile, Tile, Tile]:
        """(forward, dkdv, dq)."""
        return self.forward, self.dkdv, self.dq


# Head dim 128 on Hopper: the tiles of flex's own sm_90 backward default for head dim <= 128
# (torch/_inductor/heuristics/template/triton.py: BLOCK_M1 64, BLOCK_N1 128, BLOCK_M2 128,
# BLOCK_N2 64, 3 stages, 8 warps). dK/dV: a key tile of 128 rows (the M of every dK/dV matmul,
# computed transposed as in Triton's fused-attention tutorial) walking 64 queries at a time; dQ:
# 128 queries walking 64 keys; 8 warps (two warpgroups of 64 rows each). The forward 128 x 64
# (FlashAttention-2's Triton shape). Compiled for sm_90 without a GPU
# (tests/dllm_models/test_bd3lm_attention.py); the backward variants are not yet timed on one.
GPU_TILING = Tiling(forward=Tile(128, 64, 8, 3), dkdv=Tile(64, 128, 8, 3), dq=Tile(128, 64, 8, 3))
# small tiles for the CPU interpreter: a row of a few dozen positions spans several of each
INTERPRETER_TILING = Tiling(forward=Tile(16, 16), dkdv=Tile(16, 32), dq=Tile(32, 16))


@dataclass(frozen=True)
class BD3LMKernelOptions:
    """The kernel's backward variant and tiles (see the module doc for the variants).

    Attributes:
        backward: one of `BACKWARD_VARIANTS`.
        tiling: the tiles; None = `GPU_TILING` on CUDA, `INTERPRETER_TILING` on the CPU.
        dkdv_chunk: query tiles per dK/dV program in `chunked` and `fused` (>= 1); the other
            variants walk a key tile's whole list in one program.
    """

    backward: str = "one_launch"
    tiling: Tiling | None = None
    dkdv_chunk: int = 16

    def __post_init__(self) -> None:
        if self.backward not in BACKWARD_VARIANTS:
            raise ValueError(f"BD3LMKernelOptions.backward={self.backward!r}: choose one of {BACKWARD_VARIANTS}")
        if self.dkdv_chunk < 1:
            raise ValueError(f"BD3LMKernelOptions.dkdv_chunk={self.dkdv_chunk}: query tiles per dK/dV program "
                             "must be >= 1 (e.g. 16)")

    @property
    def chunked(self) -> bool:
        """Whether dK/dV walks are cut into pieces summed by atomics."""
        return self.backward in ("chunked", "fused")

    def resolved(self, on_cuda: bool) -> Tiling:
        """The tiling these options run with on a CUDA (True) or interpreter (False) device."""
        if self.tiling is not None:
            return self.tiling
        return GPU_TILING if on_cuda else INTERPRETER_TILING


__all__ = ["BACKWARD_VARIANTS", "BD3LMKernelOptions", "GPU_TILING", "INTERPRETER_TILING", "Tile", "Tiling"]
