"""Sparse channel-mix: relu(xk @ w_key.T) ** 2, then the value product reading only the rows
of the value weight (in its [F, C] view) whose activation is non-zero.

relu(.)**2 is exactly zero wherever the pre-activation is <= 0, so skipping those rows is
lossless. The value product runs over a grid (C blocks, F splits); split s owns the hidden
units [s * F/S, (s+1) * F/S) and walks the list of its active units (compacted in order, any
row of the M rows non-zero) GROUP rows at a time: the GROUP row loads are independent (memory
parallelism) while the float32 accumulation stays strictly sequential in unit order. Adding
an exact zero term leaves a float32 sum unchanged, so the result is bit-identical to the same
kernel with skipping disabled (`skip=False` walks every unit).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .common import next_pow2, pow2_divisor, require, triton_params
from .small_m_linear import matmul_f32, small_m_linear
from .small_m_linear import supports as linear_supports

GROUP = 8               # value-weight rows loaded together per loop iteration
MAX_BLOCK_C = 256       # output columns per program (a power of two dividing C)
TARGET_PROGRAMS = 1024  # aim for this many programs when choosing the F splits
MAX_ROWS = 16           # rows the value product accepts (h columns are loaded per unit)


def supports(M: int, F: int, C: int) -> bool:
    """Whether the sparse value product handles M rows, F hidden units and C outputs."""
    return 1 <= M <= MAX_ROWS and F % GROUP == 0 and pow2_divisor(C, MAX_BLOCK_C) >= 16


def relu_square(pre: jax.Array, dtype) -> jax.Array:
    """relu(pre) ** 2 computed in float32, rounded to dtype (pre: float32 pre-activation);
    float16 stays float32, since the square overflows it past a pre-activation of ~255."""
    out_dtype = jnp.float32 if jnp.dtype(dtype) == jnp.float16 else dtype
    return jnp.square(jnp.maximum(pre.astype(jnp.float32), 0.0)).astype(out_dtype)


def channel_mix_reference(xk, w_key, w_val_t, matmul=matmul_f32):
    """Dense plain-jnp channel-mix (the model's XLA op). xk [M, C]; w_key [F, C]; w_val_t [F, C]
    (the transpose of the checkpoint's ffn.value [C, F]). Returns relu(xk @ w_key.T)**2 @ w_val_t
    in xk.dtype, the square in float32. matmul is the product (``matmul_f32``'s contract; the
    native CPU kernels pass theirs)."""
    hidden = relu_square(matmul(xk, w_key), xk.dtype)
    return matmul(hidden, w_val_t, w_in_axis=0).astype(xk.dtype)


def choose_splits(F: int, C: int, block_c: int, target: int = TARGET_PROGRAMS) -> int:
    """Smallest S dividing F with F/S a multiple of GROUP and (C/block_c)*S >= target."""
    best = 1
    for s in range(1, F // GROUP + 1):
        if F % s == 0 and (F // s) % GROUP == 0:
            best = s
            if (C // block_c) * s >= target:
                break
    return best


def active_lists(hidden: jax.Array, splits: int, skip=True):
    """Per split, the in-order list of hidden units to visit and its length.

    hidden [M, F] -> (units [S, F/S] int32 global unit indices, padded with the split's
    first unit; counts [S] int32). skip=False lists every unit. `skip` may be a traced
    bool: both settings then share one compiled program. The j-th listed unit of a split is
    the number of its units whose running count of active units is <= j (compares
    [S, F/S, F/S], no scatter: a scatter into a fresh list costs XLA a buffer copy).
    """
    M, F = hidden.shape
    per = F // splits
    first = (jnp.arange(splits, dtype=jnp.int32) * per)[:, None]
    active = jnp.logical_or(jnp.any(hidden != 0, axis=0), jnp.logical_not(skip)).reshape(splits, per)
    running = jnp.cumsum(active, axis=1, dtype=jnp.int32)                     # [S, per]
    slots = jnp.arange(per, dtype=jnp.int32)
    position = jnp.sum(running[:, None, :] <= slots[None, :, None], axis=2, dtype=jnp.int32)  # [S, per]
    counts = running[:, -1]
    return jnp.where(slots[None, :] < counts[:, None], position, 0) + first, counts


def _value_kernel(units_ref, counts_ref, h_ref, w_ref, o_ref):
    s = pl.program_id(1)
    count = counts_ref[s]

    def group(gi, acc):
        base = gi * GROUP
        unit = [units_ref[base + g] for g in range(GROUP)]
        rows = [w_ref[unit[g], :].astype(jnp.float32) for g in range(GROUP)]
        for g in range(GROUP):
            live = (base + g < count).astype(jnp.float32)
            h = h_ref[:, unit[g]].astype(jnp.float32) * live
            acc = acc + h[:, None] * rows[g][None, :]
        return acc

    n_groups = (count + GROUP - 1) // GROUP
    acc = jnp.zeros(o_ref.shape, jnp.float32)
    o_ref[...] = jax.lax.fori_loop(0, n_groups, group, acc)


def sparse_value_product(hidden, w_val_t, *, skip=True, splits: int | None = None,
                         interpret: bool = False):
    """hidden [M, F] @ w_val_t [F, C] -> [M, C] float32, visiting only units active in any row.

    See `supports` for the shapes served; `skip` as in `active_lists`.
    """
    M, F = hidden.shape
    Fw, C = w_val_t.shape
    require(Fw == F, f"sparse_value_product: w_val_t must be [F, C] with F={F}, got {w_val_t.shape}")
    require(supports(M, F, C), f"sparse_value_product: unsupported M={M}, F={F}, C={C} (need "
                               f"M <= {MAX_ROWS}, F % {GROUP} == 0, a power-of-two divisor of C >= 16)")
    block_c = pow2_divisor(C, MAX_BLOCK_C)
    splits = splits or choose_splits(F, C, block_c)
    require(F % splits == 0 and (F // splits) % GROUP == 0,
            f"sparse_value_product: splits={splits} must divide F={F} into multiples of {GROUP}")
    per = F // splits
    units, counts = active_lists(hidden, splits, skip)
    Mp = next_pow2(M)
    hp = hidden if Mp == M else jnp.pad(hidden, ((0, Mp - M), (0, 0)))
    partials = pl.pallas_call(
        _value_kernel,
        out_shape=jax.ShapeDtypeStruct((splits, Mp, C), jnp.float32),
        grid=(C // block_c, splits),
        in_specs=[pl.BlockSpec((None, per), lambda c, s: (s, 0)),
                  pl.BlockSpec((splits,), lambda c, s: (0,)),
                  pl.BlockSpec((Mp, F), lambda c, s: (0, 0)),
                  pl.BlockSpec((F, block_c), lambda c, s: (0, c))],
        out_specs=pl.BlockSpec((None, Mp, block_c), lambda c, s: (s, 0, c)),
        compiler_params=triton_params(num_warps=4, num_stages=1),
        name="rwkv7_sparse_value_product",
        interpret=interpret,
    )(units, counts, hp, w_val_t)
    return jnp.sum(partials, axis=0)[:M]


def sparse_channel_mix(xk, w_key, w_val_t, *, skip=True, interpret: bool = False):
    """Pallas channel-mix: xk [M, C], w_key [F, C], w_val_t [F, C] -> [M, C] in xk.dtype.

    The key projection uses the small-M split-K kernel (float32 output), the value product
    `sparse_value_product`. Same result as `channel_mix_reference` up to summation order.
    """
    M, C = xk.shape
    require(w_key.shape[1] == C and w_val_t.shape == w_key.shape,
            f"sparse_channel_mix: need w_key and w_val_t both [F, C={C}], got {w_key.shape} "
            f"and {w_val_t.shape}")
    require(linear_supports(M, w_key.shape[0], C),
            f"sparse_channel_mix: key product unsupported for M={M}, F={w_key.shape[0]}, C={C}")
    pre = small_m_linear(xk, w_key, out_dtype=jnp.float32, interpret=interpret)
    hidden = relu_square(pre, xk.dtype)
    return sparse_value_product(hidden, w_val_t, skip=skip, interpret=interpret).astype(xk.dtype)
