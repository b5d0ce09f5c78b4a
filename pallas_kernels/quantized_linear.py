"""Small-M product with a quantized weight, dequantized in registers: x [M, K] @ (q * scale).T.

w is a ``QuantizedWeight``: q int8 | float8_e4m3fn [N, K] (or packed int4, uint8 [N, K / 2])
and scale float32 [N, K / G] (G input channels per scale: the int8 / int4 group, or K for fp8;
``rwkv7_core.quantization``). The grid is (N blocks, K splits) as in ``small_m_linear``: each
program streams a [block_n, K / splits] slab of q (1 byte an element, int4 half a byte) in
tiles of block_k columns, block_k a power of two dividing G, so a tile lies inside one group:
the tile's product with x (q converted to x's dtype, exact: int8, int4 and e4m3 values are
exact in bf16 / fp16 / float32) is multiplied by the tile's scale column [block_n] and
accumulated in float32 partials [splits, M, N], summed afterwards. M = 1 uses a broadcast
multiply + row sum, 1 < M <= 16 a tensor-core dot on rows padded to 16.

An int4 tile is block_k / 2 contiguous bytes of a group, unpacked in registers
(``quantized.unpack_int4``) to two [block_n, block_k / 2] halves: the low nibbles multiply one
contiguous run of x's columns, the high ones the run G / 2 further (``int4_columns``). K splits
then hold whole groups (a split's bytes are its channels' bytes).

With ``skip`` the q columns whose x column is zero in every row are not loaded (masked loads:
the channel-mix value product over relu² activations; a masked column of a row is one byte,
so memory traffic falls only where a whole 32-byte sector of units is zero). Masked columns
meet zero activations, so the sums hold the same terms as the unskipped ones (int4: the
same to float32 rounding where a compiler orders them differently; bit-identical otherwise).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import next_pow2, pow2_divisor, require, triton_params
from .quantized import QuantizedWeight, unpack_int4

MAX_M = 16
MAX_BLOCK_N = 64
MAX_BLOCK_K = 128  # a masked (skip) fp8 tile 256 wide needs 192 registers, 128 wide 114 (ptxas sm_90a)
MAX_BLOCK_K_F32_DOT = 64  # float32 M > 1 tiles are exact FMA dots: wider ones spill (small_m_linear)
MIN_BLOCK = 16
TARGET_PROGRAMS = 1024


def group_size(w: QuantizedWeight) -> int:
    """Input channels per scale (G)."""
    return w.shape[1] // w.scale.shape[1]


def quantized_linear_reference(x, w: QuantizedWeight, out_dtype=None):
    """Plain jnp: x [M, K] @ (q * scale).T with the weight dequantized to float32, float32
    accumulation; result in out_dtype (default x.dtype)."""
    out = jnp.matmul(x.astype(jnp.float32), w.dequantize(jnp.float32).T, precision=jax.lax.Precision.HIGHEST)
    return out.astype(out_dtype or x.dtype)


def tile_width(K: int, group: int, cap: int) -> int:
    """K tile: the largest power of two dividing the group (so a tile has one scale), <= cap."""
    return pow2_divisor(group, min(cap, pow2_divisor(K, cap)))


def supports(M: int, w: QuantizedWeight) -> bool:
    """Whether `quantized_linear` serves M rows of w (blocks tile N and K exactly: the Triton
    lowering does not bound-check)."""
    N, K = w.shape
    return (1 <= M <= MAX_M and tile_width(K, group_size(w), MAX_BLOCK_K) >= min_tile(w)
            and pow2_divisor(N, MAX_BLOCK_N) >= MIN_BLOCK)


def min_tile(w: QuantizedWeight) -> int:
    """Narrowest K tile of w: an int4 tile's halves are dot operands too."""
    return 2 * MIN_BLOCK if w.packed else MIN_BLOCK


def split_units(K: int, bk: int, group: int, packed: bool) -> int:
    """The count K splits must divide: the K tiles, or the groups for packed int4 (a split's
    bytes must hold its own channels, see module doc)."""
    return K // group if packed else K // bk


def choose_splits(blocks_n: int, tiles: int, target: int = TARGET_PROGRAMS) -> int:
    """Smallest divisor s of the K tiles with blocks_n * s >= target (all tiles if none)."""
    for s in range(1, tiles + 1):
        if tiles % s == 0 and blocks_n * s >= target:
            return s
    return tiles


def dequantized_product(x, q, scale, *, vector: bool):
    """One tile: x [bm, bk] @ q [bn, bk].T * scale [bn] -> float32 [bm, bn] (q converted to
    x's dtype in registers; M = 1 (`vector`) as a multiply + row sum)."""
    if vector:
        part = jnp.sum(q.astype(jnp.float32) * x.astype(jnp.float32), axis=1)[None, :]
    else:
        exact = False if x.dtype == jnp.float32 else None  # no TF32 for float32 inputs
        part = plgpu_triton.dot(x, q.astype(x.dtype), trans_b=True, allow_tf32=exact).astype(jnp.float32)
    return part * scale.astype(jnp.float32)[None, :]


def int4_columns(start, bk: int, group: int):
    """The input channels of the packed bytes [start / 2, (start + bk) / 2) of a block that
    starts on a group: (low, high) runs of bk / 2 channels (pl.ds), start a multiple of bk,
    bk dividing the group (``rwkv7_core.quantization``'s layout)."""
    half = bk // 2
    within = jax.lax.rem(start, jnp.int32(group))  # start >= 0 (jnp's % does not lower to Triton)
    low = start - within + within // 2
    return pl.ds(pl.multiple_of(low, half), half), pl.ds(pl.multiple_of(low + group // 2, half), half)


def live_columns(x):
    """x [rows, width] -> bool [width]: the columns not zero in every row (no reduce_or in Triton)."""
    return jnp.max(jnp.abs(x.astype(jnp.float32)), axis=0) > 0


def tile_product(x_at, q_ref, scale, start, bk: int, group: int, *, vector: bool, skip: bool):
    """One K tile of a quantized product: the input channels [start, start + bk) of this
    program's block (start a multiple of bk; bk divides the group) -> float32 [bm, bn].
    x_at(cols) gives x's tile [bm, width] at a pl.ds of columns; q_ref is the program's q block
    (packed int4: half as many byte columns); scale [bn] the tile's scale column; skip: q
    columns whose x column is zero in every row stay unread."""
    rows = q_ref.shape[0]
    if q_ref.dtype != jnp.uint8:
        cols = pl.ds(start, bk)
        x = x_at(cols)
        q = load_live_columns(q_ref.at[:, cols], live_columns(x), (rows, bk), x.dtype) if skip else q_ref[:, cols]
        return dequantized_product(x, q, scale, vector=vector)
    low_cols, high_cols = int4_columns(start, bk, group)
    x_low, x_high = x_at(low_cols), x_at(high_cols)
    byte_cols = pl.ds(pl.multiple_of(start // 2, bk // 2), bk // 2)
    if skip:
        live = live_columns(x_low) | live_columns(x_high)
        packed = load_live_columns(q_ref.at[:, byte_cols], live, (rows, bk // 2), jnp.uint8)
    else:
        packed = q_ref[:, byte_cols]
    low, high = unpack_int4(packed)
    return (dequantized_product(x_low, low, scale, vector=vector)
            + dequantized_product(x_high, high, scale, vector=vector))


def load_live_columns(tile_ref, live, shape, dtype):
    """A q tile [rows, width] with only the columns where live [width] holds read, converted
    to dtype, the unread columns zero (selected after the convert: the Triton lowering cannot
    fill masked float8 lanes with a constant)."""
    mask = jnp.broadcast_to(live[None, :], shape)
    return jnp.where(mask, plgpu_triton.load(tile_ref, mask=mask).astype(dtype), 0)


def _kernel(x_ref, q_ref, s_ref, o_ref, *, tiles, bk, group, vector, skip):
    first = pl.program_id(1) * (tiles * bk)  # the split's first input channel

    def body(t, acc):
        start = pl.multiple_of(t * bk, bk)
        scale = s_ref[:, (first + start) // group]
        return acc + tile_product(lambda cols: x_ref[:, cols], q_ref, scale, start, bk, group, vector=vector,
                                  skip=skip)

    o_ref[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros(o_ref.shape, jnp.float32))


def quantized_linear(x, w: QuantizedWeight, *, out_dtype=None, skip: bool = False, splits: int | None = None,
                     interpret: bool = False):
    """Pallas x [M, K] @ w.T -> [M, N] (float32 accumulation, result out_dtype or x.dtype);
    `supports` says which shapes; skip: leave q columns unread where x is zero in every row;
    splits overrides the K-split count (must divide the K tiles, or the groups for int4)."""
    M, K = x.shape
    N, Kw = w.shape
    require(Kw == K, f"quantized_linear: w must be [N, K] with K={K}, got {w.shape}")
    require(w.scale.shape[0] == N and K % w.scale.shape[1] == 0,
            f"quantized_linear: scales {w.scale.shape} do not fit q {w.shape}")
    require(supports(M, w), f"quantized_linear: unsupported M={M}, N={N}, K={K}, group {group_size(w)} (need "
                            f"M <= {MAX_M} and power-of-two divisors of N and the group >= {MIN_BLOCK})")
    group = group_size(w)
    vector = M == 1
    bk = tile_width(K, group, MAX_BLOCK_K if vector or x.dtype != jnp.float32 else MAX_BLOCK_K_F32_DOT)
    bn = pow2_divisor(N, MAX_BLOCK_N)
    units = split_units(K, bk, group, w.packed)
    splits = splits or choose_splits(N // bn, units)
    require(units % splits == 0, f"quantized_linear: splits={splits} must divide {units}")
    Mp = 1 if vector else max(16, next_pow2(M))
    xp = x if Mp == M else jnp.pad(x, ((0, Mp - M), (0, 0)))
    k_chunk = K // splits
    partials = pl.pallas_call(
        functools.partial(_kernel, tiles=k_chunk // bk, bk=bk, group=group, vector=vector, skip=skip),
        out_shape=jax.ShapeDtypeStruct((splits, Mp, N), jnp.float32),
        grid=(N // bn, splits),
        in_specs=[pl.BlockSpec((Mp, k_chunk), lambda n, s: (0, s)),
                  pl.BlockSpec((bn, k_chunk // 2 if w.packed else k_chunk), lambda n, s: (n, s)),
                  pl.BlockSpec((bn, K // group), lambda n, s: (n, 0))],
        out_specs=pl.BlockSpec((None, Mp, bn), lambda n, s: (s, 0, n)),
        compiler_params=triton_params(num_warps=4, num_stages=3),
        name="rwkv7_quantized_linear",
        interpret=interpret,
    )(xp, w.q, w.scale)
    out = partials[0] if splits == 1 else jnp.sum(partials, axis=0)
    return out[:M].astype(out_dtype or x.dtype)
