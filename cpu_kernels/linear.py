"""Matrix products of a few rows through the native CPU kernels (``linear.cc``), in the
contract of their plain-jnp reference ``pallas_kernels.small_m_linear.matmul_f32``.

``matmul_f32(x [M, K], w, w_in_axis=1) -> [M, N] float32``: x @ w.T for w [N, K] (w_in_axis=1)
or x @ w for w [K, N] (w_in_axis=0), w float32 or bfloat16, or an int8 ``QuantizedWeight``
(q int8 [N, K], scale float32 [N, K / G]). x is widened to float32; the weight is widened in
registers as it streams, so a product reads each weight byte once per pass of up to 4 rows
and writes no float copy of it. Shapes the kernels do not take (``supports``: more than
``MAX_ROWS`` rows, K or N not a multiple of 16, other weight dtypes, int4 / fp8) run the
reference. The results differ from the reference only by float32 summation order.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.small_m_linear import matmul_f32 as reference_matmul_f32

from . import library

LANES = 16
MAX_ROWS = 8  # rows up to which the native product runs; more go to XLA's GEMM (docs/benchmarks.md)
WEIGHT_NAMES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16"}


def supports(x, w, w_in_axis: int = 1) -> bool:
    """Whether the native kernels take x [M, K] and w (see module doc)."""
    M, K = x.shape
    if M > MAX_ROWS or K % LANES:
        return False
    if isinstance(w, QuantizedWeight):
        groups = w.scale.shape[1]
        return w.q.dtype == jnp.int8 and K % groups == 0 and (K // groups) % LANES == 0
    N = w.shape[1 - w_in_axis]
    return jnp.dtype(w.dtype) in WEIGHT_NAMES and (w_in_axis == 1 or N % LANES == 0)


def matmul_f32(x, w, w_in_axis: int = 1):
    """x [M, K] @ w -> [M, N] float32 (the reference's contract, see module doc)."""
    if not supports(x, w, w_in_axis):
        return reference_matmul_f32(x, w, w_in_axis)
    library.load()
    M, x = x.shape[0], x.astype(jnp.float32)
    if isinstance(w, QuantizedWeight):
        out = jax.ShapeDtypeStruct((M, w.q.shape[0]), jnp.float32)
        return jax.ffi.ffi_call("rwkv7_linear_int8", out)(x, w.q, w.scale)
    layout = "rwkv7_linear_" if w_in_axis == 1 else "rwkv7_linear_kn_"
    out = jax.ShapeDtypeStruct((M, w.shape[1 - w_in_axis]), jnp.float32)
    return jax.ffi.ffi_call(layout + WEIGHT_NAMES[jnp.dtype(w.dtype)], out)(x, w)


def linear(x, w, out_dtype=None):
    """x [M, K] @ w [N, K].T accumulated in float32; result in out_dtype (default x.dtype)."""
    return matmul_f32(x, w).astype(out_dtype or x.dtype)
