"""What the Mosaic GPU kernels share: how they run under GPU interpret mode, and its race report.

GPU interpret mode (jax >= 0.11) runs a ``plgpu.kernel`` on the CPU simulating its threads,
shared memory, TMA copies and barriers; ``interpret_params(True)`` turns on its happens-before
race detector and makes out-of-bounds reads raise. A race is not raised but recorded:
``races_found()`` reads the record, ``reset_interpreter()`` clears it (and the interpreter's
state after a failed kernel).
"""
from __future__ import annotations

# The race record lives only in jax's private interpreter module (no public accessor in 0.11).
from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

TMA_BOX = 256  # a TMA copy moves at most this many elements along each dimension


def pieces(n: int) -> list[pl.Slice]:
    """[0, n) in slices of at most TMA_BOX elements (one TMA copy each)."""
    return [pl.ds(s, min(TMA_BOX, n - s)) for s in range(0, n, TMA_BOX)]


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
