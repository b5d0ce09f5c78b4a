"""Small-M matrix product x @ w.T with split-K: M = 1 (matrix-vector) up to M = 16 rows.

x [M, K], w [N, K] (stored [out, in] as in the checkpoint). The grid is (N blocks, K splits):
each program reads a [block_n, K / splits] slab of w once, accumulates float32 partial sums
over BLOCK_K-wide tiles, and writes them to partials [splits, M, N]; the splits are summed in
float32 afterwards. Many K splits keep every SM streaming weights even when N is small, which
is what a memory-bound decode step needs. M = 1 uses a broadcast multiply + row sum (no
tensor cores); 1 < M <= 16 pads x to 16 rows and uses a tensor-core dot.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import next_pow2, pow2_divisor, require, triton_params
from .quantized import QuantizedWeight, quantized_matmul_f32

MAX_M = 16             # the largest row count this kernel serves (callers fall back to XLA above)
MAX_BLOCK_N = 64       # output columns per program (a power of two dividing N is used)
MAX_BLOCK_K = 256      # widest K tile (a power of two dividing K is used)
MAX_BLOCK_K_F32_DOT = 64  # widest K tile of the float32 M > 1 (FMA dot, no TF32) path: see block_k_for
MIN_BLOCK = 16         # tl.dot needs >= 16 on every side; N or K without such a divisor is refused
TARGET_PROGRAMS = 1024  # aim for this many programs (>= ~8 per SM on an H200) when choosing splits


def matmul_f32(x, w, w_in_axis: int = 1):
    """x [M, K] @ w -> [M, N] float32 (operands in x.dtype); w is [N, K] (w_in_axis=1) or
    [K, N] (w_in_axis=0), or a ``QuantizedWeight`` (always [N, K]; dequantized in the product)."""
    if isinstance(w, QuantizedWeight):
        return quantized_matmul_f32(x, w)

    def dot(x):
        return jax.lax.dot_general(x, w.astype(x.dtype), (((1,), (w_in_axis,)), ((), ())),
                                   preferred_element_type=jnp.float32)

    if x.shape[0] == 1 and x.dtype == jnp.bfloat16:
        # XLA:CPU's bfloat16 matrix-vector product runs ~8x slower than its 2-row product
        # (measured on [1, 768] x [12288, 768]): on the CPU, compute two identical rows and
        # keep one. Chosen by the platform the program is lowered for, not the default one.
        return jax.lax.platform_dependent(x, cpu=lambda x: dot(jnp.concatenate([x, x]))[:1], default=dot)
    return dot(x)


def linear_reference(x, w, out_dtype=None, matmul=matmul_f32):
    """x [M, K] @ w [N, K].T accumulated in float32; result in out_dtype (default x.dtype).
    The model's XLA op; matmul is the product (``matmul_f32``'s contract; the native CPU
    kernels pass theirs)."""
    return matmul(x, w).astype(out_dtype or x.dtype)


def block_k_for(M: int, K: int, dtype) -> int:
    """K tile width: the largest power of two dividing K, up to MAX_BLOCK_K. A float32 M > 1
    tile is an exact FMA dot (no TF32): at [16, 256] x [256, 64] each thread unrolls 2048 FMAs
    and ptxas (sm_90a) spills 9 KB (32 registers, 7.5 KB stack); 64-wide tiles need 122
    registers and no spill, so float32 M > 1 is capped at MAX_BLOCK_K_F32_DOT."""
    exact_dot = M > 1 and jnp.dtype(dtype) == jnp.float32
    return pow2_divisor(K, MAX_BLOCK_K_F32_DOT if exact_dot else MAX_BLOCK_K)


def choose_splits(N: int, K: int, block_k: int, target: int = TARGET_PROGRAMS) -> int:
    """Number of K splits: the smallest divisor of K / block_k giving >= target programs."""
    tiles = K // block_k
    blocks_n = N // pow2_divisor(N, MAX_BLOCK_N)
    for s in range(1, tiles + 1):
        if tiles % s == 0 and blocks_n * s >= target:
            return s
    return tiles


def supports(M: int, N: int, K: int) -> bool:
    """Whether small_m_linear handles x [M, K] @ w [N, K].T (else use an XLA dot).

    Blocks must tile N and K exactly: the Triton lowering does not bound-check blocks.
    """
    return (1 <= M <= MAX_M and pow2_divisor(K, MAX_BLOCK_K) >= MIN_BLOCK
            and pow2_divisor(N, MAX_BLOCK_N) >= MIN_BLOCK)


def _kernel(x_ref, w_ref, o_ref, *, tiles: int, block_k: int, vector: bool):
    compute = x_ref.dtype

    def body(t, acc):
        start = pl.multiple_of(t * block_k, block_k)
        w = w_ref[:, pl.ds(start, block_k)].astype(compute)
        x = x_ref[:, pl.ds(start, block_k)]
        if vector:
            return acc + jnp.sum(w.astype(jnp.float32) * x.astype(jnp.float32), axis=1)[None, :]
        exact_f32 = False if compute == jnp.float32 else None  # no TF32 for float32 inputs
        return acc + plgpu_triton.dot(x, w, trans_b=True, allow_tf32=exact_f32).astype(jnp.float32)

    acc = jnp.zeros(o_ref.shape, jnp.float32)
    o_ref[...] = jax.lax.fori_loop(0, tiles, body, acc)


def small_m_linear(x, w, *, out_dtype=None, splits: int | None = None, interpret: bool = False):
    """Pallas x [M, K] @ w [N, K].T -> [M, N] (float32 accumulation, result out_dtype or x.dtype).

    Needs 1 <= M <= MAX_M and power-of-two divisors of N and K of at least MIN_BLOCK (see
    `supports`); `splits` overrides the automatic K-split count (must divide K / block_k).
    """
    M, K = x.shape
    N, Kw = w.shape
    require(Kw == K, f"small_m_linear: w must be [N, K] with K={K}, got {w.shape}")
    require(supports(M, N, K), f"small_m_linear: unsupported M={M}, N={N}, K={K} (need M <= {MAX_M} "
                               f"and power-of-two divisors of N and K >= {MIN_BLOCK})")
    block_k = block_k_for(M, K, x.dtype)
    block_n = pow2_divisor(N, MAX_BLOCK_N)
    splits = splits or choose_splits(N, K, block_k)
    require((K // block_k) % splits == 0, f"small_m_linear: splits={splits} must divide {K // block_k}")
    vector = M == 1
    Mp = 1 if vector else max(16, next_pow2(M))
    xp = x if Mp == M else jnp.pad(x, ((0, Mp - M), (0, 0)))
    k_chunk = K // splits
    partials = pl.pallas_call(
        functools.partial(_kernel, tiles=k_chunk // block_k, block_k=block_k, vector=vector),
        out_shape=jax.ShapeDtypeStruct((splits, Mp, N), jnp.float32),
        grid=(N // block_n, splits),
        in_specs=[pl.BlockSpec((Mp, k_chunk), lambda n, s: (0, s)),
                  pl.BlockSpec((block_n, k_chunk), lambda n, s: (n, s))],
        out_specs=pl.BlockSpec((None, Mp, block_n), lambda n, s: (s, 0, n)),
        compiler_params=triton_params(num_warps=4, num_stages=3),
        name="rwkv7_small_m_linear",
        interpret=interpret,
    )(xp, w)
    out = partials[0] if splits == 1 else jnp.sum(partials, axis=0)
    return out[:M].astype(out_dtype or x.dtype)
