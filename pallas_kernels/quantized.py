"""Quantized weights in JAX: the pytree the ops take in place of a weight array, and its
plain-jnp product (the XLA path; the math is ``rwkv7_core.quantization``'s).

``QuantizedWeight(q, scale)``: q int8 | float8_e4m3fn ``[N, K]`` and scale float32
``[N, K / G]``, always in the checkpoint's [out, in] layout, the channel-mix value included
(the Pallas kernels read it so too: ``quantized_linear``, ``quantized_channel_mix``), so a
product ignores the dense weight's ``w_in_axis``.

The product dequantizes inside the jitted step, so XLA can fuse convert * scale into the
product instead of keeping a dequantized copy of the weight (checked in the optimised HLO by
``benchmarks/quant_hlo_check.py``: no float array the size of a quantized weight outside a
fusion). The form that fuses differs by backend:

- XLA:CPU fuses it into a one-row ``x @ w.T`` (a loop reading the int8 rows); ``dot_general``
  over the weight's axis 1, or a [K, N] weight, instead get a separate dequantize fusion
  writing a float32 copy (~100x slower on 40 [3072, 768] products), and a many-row dot with the
  fusion runs ~4x slower than the float32 GEMM. So up to ``CPU_ROW_PRODUCTS`` rows run as
  one-row products (the weight, a quarter of float32's bytes, is re-read from cache), more rows
  (prefill) one dequantized copy per product, its cost spread over the rows.
- XLA:GPU (deviceless H200 compile of the 1.5b step) turns a dot with the dequantize into a
  loop fusion writing the bf16 weight plus a GEMM for the channel-mix and head shapes (1.9x the
  bf16 step's bytes); a multiply + row reduction reads the int8 weight once per row inside one
  reduction fusion (0.54x). So up to ``GPU_REDUCE_ROWS`` rows use the reduction (a guess, to be
  timed on a GPU: the weight is re-read per row, from L2 when the rows run together), more the
  dot.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

CPU_ROW_PRODUCTS = 32  # rows up to which XLA:CPU runs one fused one-row product per row
GPU_REDUCE_ROWS = 8    # rows up to which the GPU product is a multiply + row reduction (see module doc)


class QuantizedWeight(NamedTuple):
    """A quantized matrix (see module doc); a pytree of two arrays."""

    q: jax.Array
    scale: jax.Array

    @property
    def shape(self):
        return self.q.shape

    def dequantize(self, dtype) -> jax.Array:
        """The weight q * scale [N, K] in `dtype`."""
        (n, k), groups = self.q.shape, self.scale.shape[1]
        w = self.q.astype(jnp.float32).reshape(n, groups, k // groups) * self.scale[:, :, None]
        return w.reshape(n, k).astype(dtype)


def quantized_matmul_f32(x, w: QuantizedWeight):
    """x [M, K] @ w.T -> [M, N] float32 (w [N, K], see module doc for the CPU form)."""
    def dot(x, dtype):
        return jnp.matmul(x.astype(dtype), w.dequantize(dtype).T, preferred_element_type=jnp.float32)

    def cpu(x):
        if x.shape[0] > CPU_ROW_PRODUCTS:
            return dot(x, jnp.float32)
        return jnp.concatenate([dot(x[i:i + 1], jnp.float32) for i in range(x.shape[0])])

    def gpu(x):
        if x.shape[0] > GPU_REDUCE_ROWS:
            return dot(x, x.dtype)
        return (x.astype(jnp.float32)[:, None, :] * w.dequantize(jnp.float32)[None]).sum(-1)

    return jax.lax.platform_dependent(x, cpu=cpu, default=gpu)
