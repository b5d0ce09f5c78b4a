"""What the Mosaic GPU kernels share: how they run under GPU interpret mode, and its race report.

GPU interpret mode (jax >= 0.11) runs a ``plgpu.kernel`` on the CPU simulating its threads,
shared memory, TMA copies and barriers; ``interpret_params(True)`` turns on its happens-before
race detector and makes out-of-bounds reads raise. A race is not raised but recorded:
``races_found()`` reads the record, ``reset_interpreter()`` clears it (and the interpreter's
state after a failed kernel).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# The race record lives only in jax's private interpreter module (no public accessor in 0.11).
from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

TMA_BOX = 256  # a TMA copy moves at most this many elements along each dimension
TMA_BYTES = 128  # ... and a multiple of this many bytes (Mosaic splits a copy over the warpgroup's threads)


def tma_ok(elements: int, itemsize: int) -> bool:
    """Whether a TMA copy of this many elements moves a whole multiple of TMA_BYTES (the
    interpreter does not check it; the GPU compile refuses it)."""
    return (elements * itemsize) % TMA_BYTES == 0


def pieces(n: int) -> list[pl.Slice]:
    """[0, n) in slices of at most TMA_BOX elements (one TMA copy each)."""
    return [pl.ds(s, min(TMA_BOX, n - s)) for s in range(0, n, TMA_BOX)]


SMEM_BUDGET = 112 * 1024  # a program's pipeline buffers: two programs share an H200 SM's 228 KiB
MAX_DEPTH = 8             # copies in flight per program beyond which more hide no latency


def pipeline_depth(step_bytes: int, steps: int, budget: int = SMEM_BUDGET) -> int:
    """Pipeline stages for steps of step_bytes of shared memory each: as many as the budget
    holds (at least 1, at most MAX_DEPTH and the step count)."""
    return max(1, min(MAX_DEPTH, steps, budget // max(step_bytes, 1)))


MAX_ACC_ELEMENTS = 64 * 128  # rows' float32 accumulator tiles: 64 registers a thread of a warpgroup
ROW = plgpu.Layout.WGMMA.reduce(1)  # a vector over a WGMMA-layout tile's rows
COL = plgpu.Layout.WGMMA.reduce(0)  # a vector over its columns


def fit_tile(M: int, rows: int, cols: int, min_rows: int = 64, min_cols: int = 8) -> tuple[int, int]:
    """(rows, cols) of a power-of-two WGMMA-layout tile narrowed (rows first, to min_rows, then
    cols, to min_cols) until M float32 accumulator tiles fit MAX_ACC_ELEMENTS."""
    while M * rows * cols > MAX_ACC_ELEMENTS and rows > min_rows:
        rows //= 2
    while M * rows * cols > MAX_ACC_ELEMENTS and cols > min_cols:
        cols //= 2
    return rows, cols


def accumulate_rows(accs: tuple, tile, vectors) -> tuple:
    """accs[m] + tile * vectors[m] broadcast along the columns: per row m the products of a
    [R, Cc] float32 tile (WGMMA layout) and a [R] float32 vector (``ROW``), kept unreduced so
    the reduction over R (shuffles across the warpgroup) runs once, after the last tile."""
    return tuple(acc + tile * jax.lax.broadcast_in_dim(v, tile.shape, (0,)) for acc, v in zip(accs, vectors))


def release_slot() -> None:
    """End of a pipeline step that read its shared-memory slot with plain loads: the proxy fence
    (``plgpu.commit_smem``) orders those generic-proxy reads before the TMA copy (async proxy)
    that ``emit_pipeline`` issues next into the same slot (without it the interpreter's race
    detector reports the write-after-read)."""
    plgpu.commit_smem()


def zeros(shape: tuple[int, ...], layout):
    """float32 zeros in `layout` (a loop carry's layout must match the body's)."""
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), layout)


def interpret_params(interpret: bool) -> plgpu.InterpretGPUParams | None:
    """GPU interpret mode with race detection and raising out-of-bounds reads, or None (compile)."""
    if not interpret:
        return None
    return plgpu.InterpretGPUParams(detect_races=True, out_of_bounds_reads="raise")


def races_found() -> bool:
    """Whether an interpreted kernel raced since the last ``reset_interpreter``."""
    return bool(gpu_callbacks.get_races().races_found)


def reset_interpreter() -> None:
    """Clear the interpreter's race record and state."""
    gpu_callbacks.reset_gpu_interpret_mode_state()
