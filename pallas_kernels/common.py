"""Shared helpers for the Pallas kernels: Triton compiler parameters and block sizing.

Every kernel here uses the Pallas *Triton* lowering (see README.md for why), which needs
explicit ``CompilerParams`` and power-of-two block shapes; non-power-of-two sizes are
handled with masks or with a power-of-two divisor of the dimension.
"""
from __future__ import annotations

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


def require(cond: bool, message: str) -> None:
    """Raise ValueError(message) unless cond holds (bad shapes/dtypes at trace time)."""
    if not cond:
        raise ValueError(message)
