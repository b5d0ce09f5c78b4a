"""Quantized weights in JAX: the pytree the ops take in place of a weight array, and its
plain-jnp product (the XLA path; the math is ``rwkv7_core.quantization``'s).

``QuantizedWeight(q, scale)``: q int8 | float8_e4m3fn ``[N, K]``, or int4 packed two a byte
as uint8 ``[N, K / 2]`` (``rwkv7_core.quantization``'s layout: in each group of G input
channels, byte j holds channel j in its low nibble and channel j + G / 2 in its high one;
``unpack_int4`` is the one jnp unpacking, used by ``dequantize`` and the kernels), and scale
float32 ``[N, K / G]``, always in the checkpoint's [out, in] layout, the channel-mix value
included (the Pallas kernels read it so too: ``quantized_linear``, ``quantized_channel_mix``),
so a product ignores the dense weight's ``w_in_axis``. ``shape`` is the logical [N, K].

The product dequantizes inside the jitted step, so XLA can fuse convert * scale into the
product instead of keeping a dequantized copy of the weight (checked in the optimised HLO by
``benchmarks/quant_hlo_check.py``: no float array the size of a quantized weight outside a
fusion). The form that fuses differs by backend:

- XLA:CPU fuses it into a one-row ``x @ w.T`` (a loop reading the int8 rows); ``dot_general``
  over the weight's axis 1, or a [K, N] weight, instead get a separate dequantize fusion
  writing a float32 copy (~100x slower on 40 [3072, 768] products), and a many-row dot with the
  fusion runs ~4x slower than the float32 GEMM. So up to ``CPU_ROW_PRODUCTS`` rows run as
  one-row products (each re-reads the int8 weight), their input rows first made a buffer of
  their own (``computed_once``): left to itself XLA fuses x's producers (the LayerNorm and
  token-shift mix before a projection, the GroupNorm and gate before the output one) into the
  product's loop and recomputes them for every one of the N output rows, which made the 0.1b
  B = 1 step's products ~2.5x slower (27 vs 11 ms of one core; a [3072, 768] product with its
  LayerNorm + mix 0.53 vs 0.23 ms). More rows dequantize the weight into a
  float32 scratch of at most ``CPU_SCRATCH_ELEMENTS`` (the head in slices of rows) that the
  float32 GEMM reads, its cost spread over the rows. Each slice's copy is made to wait for the
  previous product through an exact zero computed from it (XLA:CPU otherwise makes every
  weight's copy at the start of the step: 516 MB of temporaries in the 0.1b B=32 step, 10 MB with the
  zeros), so one slice-sized scratch is live at a time. A 2 MB scratch, which stays in cache
  between its copy and its GEMM, beats 16 MB (0.1b int8 step on one core: B = 8 70 vs 128 ms,
  B = 32 241 vs 282 ms; 1 MB and 4 MB within 10% of it). On that step the row products and the
  scratch cost about the same at B = 4 (58 vs 62 ms of one core), the scratch wins from B = 8
  (docs/models.md).
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

CPU_ROW_PRODUCTS = 4  # rows up to which XLA:CPU runs one fused one-row product per row (measured)
CPU_SCRATCH_ELEMENTS = 1 << 19  # most weight elements dequantized at once for a many-row CPU product (2 MB)
GPU_REDUCE_ROWS = 8    # rows up to which the GPU product is a multiply + row reduction (see module doc)


def unpack_int4(packed):
    """Packed int4 bytes uint8 [..., J] -> (low, high) int32 [..., J]: each byte's two 4-bit
    two's-complement values (integer ops only, so a Pallas kernel unpacks a tile the same way)."""
    b = packed.astype(jnp.int32)
    return ((b & 0xF) ^ 8) - 8, ((b >> 4) ^ 8) - 8


class QuantizedWeight(NamedTuple):
    """A quantized matrix (see module doc); a pytree of two arrays."""

    q: jax.Array
    scale: jax.Array

    @property
    def packed(self) -> bool:
        """Whether q holds int4 values two a byte."""
        return self.q.dtype == jnp.uint8

    @property
    def shape(self) -> tuple[int, int]:
        """The logical [N, K]."""
        n, k = self.q.shape
        return (n, 2 * k) if self.packed else (n, k)

    def dequantize(self, dtype, widen=None) -> jax.Array:
        """The weight q * scale [N, K] in `dtype`; widen(q) gives q (int8, int4 unpacked to
        int8, or float8) as float32 (default: a convert)."""
        (n, k), groups = self.shape, self.scale.shape[1]
        q = self.q
        if self.packed:  # [N, groups, 2, G / 2] -> [N, K]: low nibbles then high ones per group
            low, high = unpack_int4(q.reshape(n, groups, 1, k // groups // 2))
            q = jnp.concatenate([low, high], axis=2).astype(jnp.int8).reshape(n, k)
        q = q.astype(jnp.float32) if widen is None else widen(q)
        w = q.reshape(n, groups, k // groups) * self.scale[:, :, None]
        return w.reshape(n, k).astype(dtype)


def cpu_float32(q):
    """q (int8 | float8_e4m3fn) as float32, in the form XLA:CPU runs fastest. XLA:CPU converts
    float8 in software (the 0.1b B = 1 fp8 step ran ~5x slower than int8); an e4m3fn byte's
    sign and 7 magnitude bits placed as a float16's (bits 15 and 13..7) are the same number
    divided by 2**8 (exponent bias 15 against 7, subnormals included), which the hardware's
    float16 convert widens: exact for every finite value (the two NaN codes give 480: quantized
    weights have none)."""
    if q.dtype != jnp.float8_e4m3fn:
        return q.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(q, jnp.int8).astype(jnp.int16) << 7  # sign to bits 15 and 14
    half = jax.lax.bitcast_convert_type(bits & jnp.int16(~(1 << 14)), jnp.float16)
    return half.astype(jnp.float32) * 256.0


def computed_once(x):
    """x itself, divided by an exact 1 computed from x (so XLA cannot fold it away): XLA:CPU
    fuses a one-row product's cheap elementwise producers into the product's loop and recomputes
    them for every output row, but never fuses a division into a consumer that reuses each
    element, so x's producers run once, into their own buffer (see module doc)."""
    return x / (1 + (x > 0).astype(x.dtype) * 0.0)


def quantized_matmul_f32(x, w: QuantizedWeight):
    """x [M, K] @ w.T -> [M, N] float32 (w [N, K], see module doc for the CPU form)."""
    def dot(x, dtype, widen=None):
        return jnp.matmul(x.astype(dtype), w.dequantize(dtype, widen).T, preferred_element_type=jnp.float32)

    def cpu(x):
        if x.shape[0] <= CPU_ROW_PRODUCTS:
            x = computed_once(x.astype(jnp.float32))
            return jnp.concatenate([dot(x[i:i + 1], jnp.float32, cpu_float32) for i in range(x.shape[0])])
        (n, k), x = w.shape, x.astype(jnp.float32)
        rows, parts, last = max(1, CPU_SCRATCH_ELEMENTS // k), [], x
        for start in range(0, n, rows):
            zero = (last[0, 0] > 0).astype(jnp.float32) * 0.0  # exactly 0: orders this copy after `last`
            part = QuantizedWeight(w.q[start:start + rows], w.scale[start:start + rows] + zero)
            parts.append(last := jnp.matmul(x, part.dequantize(jnp.float32, cpu_float32).T))
        return jnp.concatenate(parts, axis=1)

    def gpu(x):
        if x.shape[0] > GPU_REDUCE_ROWS:
            return dot(x, x.dtype)
        return (x.astype(jnp.float32)[:, None, :] * w.dequantize(jnp.float32)[None]).sum(-1)

    return jax.lax.platform_dependent(x, cpu=cpu, default=gpu)
