"""Triton kernels for the torch reference's time-mix core (``kernels="triton"``).

``wkv7_step.py``: the fused T=1 step; ``wkv7_seq.py``: the [B, T] recurrence. Each
module exposes its plain-torch ``reference``. On CPU they run only under
TRITON_INTERPRET=1, which must be set before these modules are imported (the
``@triton.jit`` decorator reads it). Both read and write the wkv state in its state dtype; a
bfloat16 state is stored rounded to nearest when compiled, but the interpreter (triton 3.x)
truncates float32 -> bfloat16, so interpreted runs of a bfloat16 state drift a little more
than the torch ops (float16 rounds to nearest in both).
"""
from __future__ import annotations

from ..wkv import CoreParams, time_mix_core
from . import wkv7_seq, wkv7_step
from .interpreter import runtime_loops_broken

__all__ = ["interpreted", "runtime_loops_broken", "time_mix_core_triton", "wkv7_seq", "wkv7_step"]


def interpreted() -> bool:
    """Whether the kernels were built for the Triton interpreter (the only way to run
    them on CPU tensors)."""
    return wkv7_seq.INTERPRETED


def time_mix_core_triton(r, w_raw, k, v, a, p: CoreParams, S):
    """``wkv.time_mix_core`` on Triton: the fused kernel for T = 1, otherwise torch
    prepare/read-out around the Triton recurrence. Shapes as in ``time_mix_core``."""
    if r.shape[1] == 1:
        return wkv7_step.wkv7_step_fused(r, w_raw, k, v, a, p, S)
    return time_mix_core(r, w_raw, k, v, a, p, S, wkv_seq=wkv7_seq.wkv7_seq)
