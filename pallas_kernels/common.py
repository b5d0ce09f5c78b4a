"""Shared helpers for the Pallas kernels: Triton compiler parameters and block sizing.

Every kernel here uses the Pallas *Triton* lowering (see README.md for why), which needs
explicit ``CompilerParams`` and power-of-two block shapes; non-power-of-two sizes are
handled with masks or with a power-of-two divisor of the dimension.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton


def triton_params(num_warps: int = 4, num_stages: int = 1) -> plgpu_triton.CompilerParams:
    """Compiler parameters selecting the Triton lowering for a pallas_call."""
    return plgpu_triton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two that divides n and is <= cap."""
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


STATE_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
"""The dtypes a wkv state may be held in (``rwkv7_core.state``); the kernels read it into
float32 registers and round it back when they store it."""


def is_state_dtype(dtype) -> bool:
    """Whether ``dtype`` is one a wkv state may be held in (``STATE_DTYPES``)."""
    return any(dtype == d for d in STATE_DTYPES)


def require(cond: bool, message: str) -> None:
    """Raise ValueError(message) unless cond holds (bad shapes/dtypes at trace time)."""
    if not cond:
        raise ValueError(message)


def rows_per_program(M: int, cap: int) -> int:
    """Rows per program of a row-wise kernel over M rows: the largest power of two <= min(M, cap)
    (the last block is moved back to end at row M, see `row_window`)."""
    return 1 << (min(M, cap).bit_length() - 1)


def row_window(i, bm: int, M: int):
    """Rows [start, start + bm) of row block i: i * bm, moved back to end at M for the last
    block (it then repeats rows of the block before it: a row-wise kernel rewrites the same
    values), so no load or store needs a mask."""
    return pl.ds(jnp.minimum(i * bm, M - bm), bm)
