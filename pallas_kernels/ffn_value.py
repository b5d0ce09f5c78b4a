"""The channel-mix value product reading the key product's split-K partials: relu² and the
value weight streamed in one split-K launch, beside the plain-jnp channel-mix it implements.

pre: the key product as ``segment_linear`` partials [splits_in, Mp, F] (float32, unrounded, as
``channel_mix_reference``'s pre-activation is). Each program of the grid (row blocks, C blocks,
F splits) sums the partials of its F tiles, squares the ReLU (``relu_square``: float32, rounded
to the model dtype, float16 kept float32) and accumulates hidden @ w_val_t [F, C] over its F
range into float32 partials [splits, Mp, C] (a ``SplitSum``: the next shift_mix or ``h + delta``
reduces them). With ``skip`` the value rows of units whose activation is zero in every row of
the block are not read: their loads are masked off (a row of a C block is 64 contiguous
elements, whole 32-byte sectors), so at sparsity s the launch streams (1 - s) of the value
weight, with no launch to list the active units (``sparse_channel_mix`` lists them in XLA). The
masked rows load as zeros and meet zero activations, so the sums are bit-identical to the
dense ones (tested).

The value weight may be a ``QuantizedWeight`` in its [out, in] = [C, F] layout (q int8 |
float8_e4m3fn | packed int4, float32 scales [C, F / G]): each tile q [C block, F tile] (F tile
a power of two dividing G: one scale per row) is converted to the hidden dtype in registers
and its product multiplied by the scale column (``quantized_linear.tile_product``; int4 tiles
unpacked there, F splits holding whole groups). In that layout a hidden unit is a column, one
byte per row (int4: half a byte, a byte holding two units G / 2 apart): ``skip`` masks the
columns of zero units, which saves traffic only where a whole 32-byte sector is zero.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import pow2_divisor, require, triton_params
from .quantized import QuantizedWeight
from .quantized_linear import MAX_BLOCK_K as MAX_QUANTIZED_TILE
from .quantized_linear import group_size, split_units, tile_product
from .segment_linear import choose_splits, row_block, sum_splits
from .sparse_channel_mix import channel_mix_reference, relu_square

MAX_BLOCK_C = 64
MAX_BLOCK_F = 256      # F tile of the one-row (vector) path
MAX_BLOCK_F_DOT = 32   # F tile of the tensor-core path (M > 1)
TARGET_PROGRAMS = 528

ffn_value_reference = channel_mix_reference  # the value product is the channel-mix's second half


def supports(F: int, C: int, group: int | None = None, packed: bool = False) -> bool:
    """Whether the kernel serves F units and C outputs (a quantized value weight: with scale
    groups of `group` units; packed int4 tiles need two halves of >= 16)."""
    return (pow2_divisor(F, MAX_BLOCK_F) >= 16 and pow2_divisor(C, MAX_BLOCK_C) >= 16
            and (group is None or pow2_divisor(group, MAX_BLOCK_F) >= (32 if packed else 16)))


def _kernel(p_ref, *refs, splits_in, tiles, bf, dtype, skip, group):
    w_ref, o_ref = refs[0], refs[-1]
    bm = o_ref.shape[0]
    hidden_dtype = relu_square(jnp.zeros((), jnp.float32), dtype).dtype
    if group:
        return _quantized_body(p_ref, w_ref, refs[1], o_ref, splits_in=splits_in, tiles=tiles, bf=bf, dtype=dtype,
                               skip=skip, group=group)

    def body(t, acc):
        cols = pl.ds(pl.multiple_of(t * bf, bf), bf)
        pre = sum_splits(lambda s: p_ref[s, :, cols], splits_in)
        h = relu_square(pre, dtype)
        if skip:
            live = (jnp.max(h.astype(jnp.float32), axis=0) > 0)[:, None]  # relu^2 >= 0; no reduce_or in Triton
            w = plgpu_triton.load(w_ref.at[cols, :], mask=jnp.broadcast_to(live, (bf, w_ref.shape[1])), other=0)
        else:
            w = w_ref[cols, :]
        if bm == 1:
            return acc + jnp.sum(h.astype(jnp.float32).reshape(bf, 1) * w.astype(jnp.float32), axis=0)[None, :]
        exact = False if hidden_dtype == jnp.float32 else None
        return acc + plgpu_triton.dot(h, w.astype(hidden_dtype), allow_tf32=exact).astype(jnp.float32)

    o_ref[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros(o_ref.shape, jnp.float32))


def _quantized_body(p_ref, q_ref, s_ref, o_ref, *, splits_in, tiles, bf, dtype, skip, group):
    """The F loop over a quantized value weight q [C block, F range] (see module doc)."""
    first = pl.program_id(2) * (tiles * bf)  # the split's first unit

    def hidden(cols):
        return relu_square(sum_splits(lambda s: p_ref[s, :, cols], splits_in), dtype)

    def body(t, acc):
        start = pl.multiple_of(t * bf, bf)
        return acc + tile_product(hidden, q_ref, s_ref[:, (first + start) // group], start, bf, group,
                                  vector=o_ref.shape[0] == 1, skip=skip)

    o_ref[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros(o_ref.shape, jnp.float32))


def ffn_value(pre_partials, w_val_t, *, M: int, dtype, splits: int | None = None, skip: bool = False,
              interpret: bool = False):
    """Pallas: pre_partials float32 [splits_in, Mp, F] (the key product), w_val_t [F, C] (or a
    QuantizedWeight [C, F]) ->
    value partials float32 [splits, Mp, C] (see module doc; M real rows, dtype the model's;
    skip: leave the value rows of all-zero activations unread)."""
    splits_in, Mp, F = pre_partials.shape
    quantized = isinstance(w_val_t, QuantizedWeight)
    C, Fw = w_val_t.shape if quantized else w_val_t.shape[::-1]
    group = group_size(w_val_t) if quantized else 0
    require(Fw == F, f"ffn_value: the value weight must be [F={F}, C] (quantized: [C, F]), got {w_val_t.shape}")
    packed = quantized and w_val_t.packed
    require(supports(F, C, group or None, packed), f"ffn_value: unsupported F={F}, C={C}, group {group}")
    bm = row_block(M)
    require(Mp % bm == 0, f"ffn_value: partials rows {Mp} must be a multiple of {bm}")
    # the dot path holds splits_in partial tiles [bm, bf] in registers: narrow F tiles keep it
    # spill-free (bm = 32, bf = 256 spilled 232 B in bf16)
    bf = pow2_divisor(group or F, MAX_BLOCK_F if bm == 1 else MAX_BLOCK_F_DOT)
    if quantized:  # skip and not the same tiles (bit-identical sums); see quantized_linear.MAX_BLOCK_K
        bf = min(bf, MAX_QUANTIZED_TILE)
    bc = pow2_divisor(C, MAX_BLOCK_C)
    units = split_units(F, bf, group, packed)
    splits = splits or choose_splits((Mp // bm) * (C // bc), units, TARGET_PROGRAMS)
    require(units % splits == 0, f"ffn_value: splits={splits} must divide {units}")
    f_chunk = F // splits
    return pl.pallas_call(
        functools.partial(_kernel, splits_in=splits_in, tiles=f_chunk // bf, bf=bf, dtype=jnp.dtype(dtype),
                          skip=skip, group=group),
        out_shape=jax.ShapeDtypeStruct((splits, Mp, C), jnp.float32),
        grid=(Mp // bm, C // bc, splits),
        in_specs=[pl.BlockSpec((splits_in, bm, f_chunk), lambda m, c, s: (0, m, s))]
                 + ([pl.BlockSpec((bc, f_chunk // 2 if packed else f_chunk), lambda m, c, s: (c, s)),
                     pl.BlockSpec((bc, F // group), lambda m, c, s: (c, 0))] if quantized
                    else [pl.BlockSpec((f_chunk, bc), lambda m, c, s: (s, c))]),
        out_specs=pl.BlockSpec((None, bm, bc), lambda m, c, s: (s, m, c)),
        compiler_params=triton_params(num_warps=4, num_stages=3),
        name="rwkv7_ffn_value",
        interpret=interpret,
    )(pre_partials, *((w_val_t.q, w_val_t.scale) if quantized else (w_val_t,)))
