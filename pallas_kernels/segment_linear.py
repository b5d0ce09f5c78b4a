"""Several products x_i @ w_i.T in one weight-streaming split-K launch (the decode time-mix's
receptance, key, value and LoRA down-projections), each segment reading its own input row.

xs [n_in, M, K] are stacked inputs (the token-shift mixes as ``shift_mix`` writes them, read in
place by index: nothing is sliced out); segment i multiplies ``xs[inputs[i]]`` by w_i [N_i, K].
The grid is (M blocks, output blocks over all segments, K splits): a program finds its segment
from its output block, streams a [block_n, K / splits] slab of that segment's weight and writes
float32 partial sums to partials [splits, Mp, sum N_i] (segments side by side, in order; Mp = M
rounded up to the row block, padded rows are zero). Consumers sum the splits themselves
(``sum_splits``), so no reduction launch follows. M = 1 uses a broadcast multiply + row sum; M > 1
a tensor-core dot on row blocks of 16..64.

A weight may be a ``QuantizedWeight`` (q int8 | float8_e4m3fn [N_i, K], float32 scales
[N_i, K / G]): its tiles are converted to the input dtype in registers and the tile's product
is multiplied by the tile's scale column (K tiles are a power of two dividing G, so one scale
per row and tile; ``pallas_kernels.quantized_linear``); plain and quantized segments share a
launch (the quantized r/k/v beside the LoRA downs). With packed int4 segments (all of one
group G; no int8 / fp8 beside them) every tile is taken as two runs of input channels G / 2
apart (``quantized_linear.int4_columns``): an int4 segment unpacks its tile's bytes into them
(``quantized.unpack_int4``), a plain one reads those columns, and K splits hold whole groups.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import next_pow2, pow2_divisor, require, triton_params
from .quantized import QuantizedWeight, unpack_int4
from .quantized_linear import dequantized_product, group_size, int4_columns, split_units
from .small_m_linear import matmul_f32

MAX_M = 256            # decode rows served (the batched-decode limit)
MAX_BLOCK_N = 64       # output columns per program (a power of two dividing every N_i)
MAX_BLOCK_K = 256      # widest K tile
MAX_BLOCK_K_F32_DOT = 64  # float32 tensor-core tiles wider than this spill (see REPORT in docs)
MIN_BLOCK = 16
TARGET_PROGRAMS = 528  # >= 4 programs per SM on a 132-SM H200 where the shape allows


class SplitSum:
    """An unreduced product: partials float32 [splits, Mp, N] whose sum over splits, rows [:M],
    rounded to dtype, is the value. A fused consumer reads the partials; ``h + split_sum`` (and
    ``total()``) reduces them with XLA where no kernel consumes them."""

    def __init__(self, partials: jax.Array, M: int, dtype):
        self.partials, self.M, self.dtype = partials, M, jnp.dtype(dtype)

    def total(self) -> jax.Array:
        """The value [M, N] in dtype."""
        return self.partials.sum(0)[:self.M].astype(self.dtype)

    def __radd__(self, other: jax.Array) -> jax.Array:
        return other + self.total().astype(other.dtype)


def segment_linear_reference(xs, weights, inputs):
    """Plain-jnp version: [x_{inputs[i]} @ w_i.T for each segment] as a list of [M, N_i] in
    xs.dtype (float32 accumulation), the products the time-mix takes one by one."""
    return [matmul_f32(xs[j], w).astype(xs.dtype) for w, j in zip(weights, inputs)]


def row_block(M: int) -> int:
    """Rows per program: 1 for a single row (vector path), else 16..64."""
    return 1 if M == 1 else min(64, max(16, next_pow2(M)))


def padded_rows(M: int) -> int:
    bm = row_block(M)
    return -(-M // bm) * bm


def sum_splits(load, splits: int, dtype=None):
    """sum over s < splits of load(s) (one split's float32 partials), rounded to dtype (as the
    reference's product is; None: not rounded); returns float32. A static loop: the split count
    need not be a power of two."""
    total = load(jnp.int32(0))
    for s in range(1, splits):
        total = total + load(jnp.int32(s))
    return total if dtype is None else total.astype(dtype).astype(jnp.float32)


def groups(weights) -> list[int]:
    """The scale group (input channels per scale) of each quantized weight."""
    return [group_size(w) for w in weights if isinstance(w, QuantizedWeight)]


def packed(weights) -> bool:
    """Whether any weight is packed int4."""
    return any(isinstance(w, QuantizedWeight) and w.packed for w in weights)


def supports(M: int, Ns, K: int, quant_groups=(), packed: bool = False) -> bool:
    """Whether the kernel serves M rows, segment widths Ns and depth K, with quantized
    segments of these scale groups (``groups``; `packed`: int4 ones, one group, whose tiles'
    halves are dot operands), else use the reference."""
    narrowest = 2 * MIN_BLOCK if packed else MIN_BLOCK
    return (1 <= M <= MAX_M and pow2_divisor(K, MAX_BLOCK_K) >= narrowest
            and min(pow2_divisor(n, MAX_BLOCK_N) for n in Ns) >= MIN_BLOCK
            and all(pow2_divisor(g, MAX_BLOCK_K) >= narrowest for g in quant_groups)
            and (not packed or len(set(quant_groups)) == 1))


def _blocks(M, Ns, K, dtype, quant_groups=()):
    bm = row_block(M)
    bn = min(pow2_divisor(n, MAX_BLOCK_N) for n in Ns)
    cap = MAX_BLOCK_K if (bm == 1 or jnp.dtype(dtype) != jnp.float32) else MAX_BLOCK_K_F32_DOT
    bk = pow2_divisor(K, min(cap, 128 if bm >= 64 else cap))
    for g in quant_groups:  # a K tile inside one scale group
        bk = pow2_divisor(g, bk)
    return bm, bn, bk


def choose_splits(blocks: int, tiles: int, target: int = TARGET_PROGRAMS) -> int:
    """Smallest divisor s of the K tiles with blocks * s >= target (all tiles if none)."""
    for s in range(1, tiles + 1):
        if tiles % s == 0 and blocks * s >= target:
            return s
    return tiles


def _kernel(*refs, starts, inputs, groups, M, tiles, bk, vector):
    n_seg = len(inputs)
    x_ref, w_refs, o_ref = refs[0], refs[1:-1], refs[-1]
    n = pl.program_id(1)
    seg = sum((n >= s).astype(jnp.int32) for s in starts[1:])
    mix = sum(jnp.where(seg == i, jnp.int32(j), jnp.int32(0)) for i, j in enumerate(inputs))
    bm = o_ref.shape[0]
    row_ok = (pl.program_id(0) * bm + jnp.arange(bm)) < M

    if any(w.dtype == jnp.uint8 for w in w_refs):
        return _int4_body(x_ref, w_refs, o_ref, seg=seg, mix=mix, row_ok=row_ok, groups=groups,
                          tiles=tiles, bk=bk, vector=vector)
    if any(groups):
        return _quantized_body(x_ref, w_refs, o_ref, seg=seg, mix=mix, row_ok=row_ok, groups=groups,
                               tiles=tiles, bk=bk, vector=vector)

    def body(t, acc):
        cols = pl.ds(pl.multiple_of(t * bk, bk), bk)
        # one loop and one product for every segment: only the weight tile's source differs
        # (a loop per segment would give each its own shared-memory pipeline buffers)
        w = jax.lax.switch(seg, [lambda i=i: w_refs[i][:, cols] for i in range(n_seg)]) if n_seg > 1 \
            else w_refs[0][:, cols]
        if vector:
            x = x_ref[mix, :, cols].astype(jnp.float32)
            return acc + jnp.sum(w.astype(jnp.float32) * x, axis=1)[None, :]
        x = plgpu_triton.load(x_ref.at[mix, :, cols], mask=row_ok[:, None], other=0)
        exact = False if x.dtype == jnp.float32 else None  # no TF32 for float32 inputs
        return acc + plgpu_triton.dot(x, w, trans_b=True, allow_tf32=exact).astype(jnp.float32)

    o_ref[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros(o_ref.shape, jnp.float32))


def _weight_refs(w_refs, groups) -> list:
    """Per segment (its weight ref, its scale ref or None): w_refs holds each segment's weight,
    followed by its scales where the segment is quantized (groups[i] > 0)."""
    refs, at = [], 0
    for g in groups:
        refs.append((w_refs[at], w_refs[at + 1] if g else None))
        at += 2 if g else 1
    return refs


def _quantized_body(x_ref, w_refs, o_ref, *, seg, mix, row_ok, groups, tiles, bk, vector):
    """The loop with quantized segments: each segment's tile comes as (tile in the input dtype,
    scale column float32 [bn]); a plain segment's scale is one. w_refs: per segment its weight,
    and after a quantized one its scales."""
    first = pl.program_id(2) * (tiles * bk)  # the split's first input channel
    dtype = x_ref.dtype
    refs = _weight_refs(w_refs, groups)

    def body(t, acc):
        start = pl.multiple_of(t * bk, bk)
        cols = pl.ds(start, bk)

        def tile(i):
            w_ref, s_ref = refs[i]
            if s_ref is None:
                return w_ref[:, cols].astype(dtype), jnp.ones((w_ref.shape[0],), jnp.float32)
            return w_ref[:, cols].astype(dtype), s_ref[:, (first + start) // groups[i]]

        w, scale = jax.lax.switch(seg, [functools.partial(tile, i) for i in range(len(refs))]) \
            if len(refs) > 1 else tile(0)
        if vector:
            x = x_ref[mix, :, cols]
        else:
            x = plgpu_triton.load(x_ref.at[mix, :, cols], mask=row_ok[:, None], other=0)
        return acc + dequantized_product(x, w, scale, vector=vector)

    o_ref[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros(o_ref.shape, jnp.float32))


def _int4_body(x_ref, w_refs, o_ref, *, seg, mix, row_ok, groups, tiles, bk, vector):
    """The loop with packed int4 segments (one group G): each segment's tile comes as (low
    half, high half in the input dtype, scale column float32 [bn]), the halves the columns
    ``int4_columns`` names; a plain segment reads those columns, its scale one."""
    group = max(groups)
    first = pl.program_id(2) * (tiles * bk)
    dtype = x_ref.dtype
    refs = _weight_refs(w_refs, groups)

    def body(t, acc):
        start = pl.multiple_of(t * bk, bk)
        low_cols, high_cols = int4_columns(start, bk, group)

        def tile(i):
            w_ref, s_ref = refs[i]
            if s_ref is None:
                return (w_ref[:, low_cols].astype(dtype), w_ref[:, high_cols].astype(dtype),
                        jnp.ones((w_ref.shape[0],), jnp.float32))
            low, high = unpack_int4(w_ref[:, pl.ds(pl.multiple_of(start // 2, bk // 2), bk // 2)])
            return low.astype(dtype), high.astype(dtype), s_ref[:, (first + start) // group]

        w_low, w_high, scale = jax.lax.switch(seg, [functools.partial(tile, i) for i in range(len(refs))]) \
            if len(refs) > 1 else tile(0)

        def x_at(cols):
            if vector:
                return x_ref[mix, :, cols]
            return plgpu_triton.load(x_ref.at[mix, :, cols], mask=row_ok[:, None], other=0)

        return acc + (dequantized_product(x_at(low_cols), w_low, scale, vector=vector)
                      + dequantized_product(x_at(high_cols), w_high, scale, vector=vector))

    o_ref[...] = jax.lax.fori_loop(0, tiles, body, jnp.zeros(o_ref.shape, jnp.float32))


def segment_linear(xs, weights, inputs, *, splits: int | None = None, target: int = TARGET_PROGRAMS,
                   interpret: bool = False):
    """Pallas: xs [n_in, M, K], weights [w_i [N_i, K]], inputs [index into xs per segment]
    -> partials float32 [splits, Mp, sum N_i] (see the module doc; sum over axis 0 and take
    rows [:M] to get the concatenated products). splits: the K splits (default: the fewest
    giving >= `target` programs; fewer splits mean fewer partials for the consumer to sum)."""
    n_in, M, K = xs.shape
    Ns = [w.shape[0] for w in weights]
    require(len(weights) == len(inputs) and all(0 <= j < n_in for j in inputs),
            "segment_linear: one input index in range per weight")
    require(all(w.shape == (n, K) and (isinstance(w, QuantizedWeight) or w.dtype == xs.dtype)
                for w, n in zip(weights, Ns)),
            f"segment_linear: weights must be [N_i, K={K}] in {xs.dtype} (or quantized)")
    seg_groups = tuple(group_size(w) if isinstance(w, QuantizedWeight) else 0 for w in weights)
    int4 = packed(weights)
    require(not int4 or all(not isinstance(w, QuantizedWeight) or w.packed for w in weights),
            "segment_linear: packed int4 segments cannot share a launch with int8 / fp8 ones")
    require(supports(M, Ns, K, groups(weights), int4), f"segment_linear: unsupported M={M}, N={Ns}, K={K}, "
                                                       f"groups {groups(weights)}")
    bm, bn, bk = _blocks(M, Ns, K, xs.dtype, groups(weights))
    Mp = padded_rows(M)
    nblocks = [n // bn for n in Ns]
    starts = [sum(nblocks[:i]) for i in range(len(Ns))]
    tiles = K // bk
    units = split_units(K, bk, max(seg_groups), True) if int4 else tiles
    splits = splits or choose_splits((Mp // bm) * sum(nblocks), units, target)
    require(units % splits == 0, f"segment_linear: splits={splits} must divide {units}")
    k_chunk = K // splits

    def weight_specs(i):
        """The weight's block (and its scales' block: the rows' whole scale rows)."""
        first, count = starts[i], nblocks[i]
        width = k_chunk // 2 if isinstance(weights[i], QuantizedWeight) and weights[i].packed else k_chunk
        specs = [pl.BlockSpec((bn, width), lambda m, n, s: (jnp.clip(n - first, 0, count - 1), s))]
        if seg_groups[i]:
            specs.append(pl.BlockSpec((bn, K // seg_groups[i]),
                                      lambda m, n, s: (jnp.clip(n - first, 0, count - 1), 0)))
        return specs

    operands = [a for w in weights for a in ((w.q, w.scale) if isinstance(w, QuantizedWeight) else (w,))]
    return pl.pallas_call(
        functools.partial(_kernel, starts=starts, inputs=tuple(inputs), groups=seg_groups, M=M,
                          tiles=k_chunk // bk, bk=bk, vector=bm == 1),
        out_shape=jax.ShapeDtypeStruct((splits, Mp, sum(Ns)), jnp.float32),
        grid=(Mp // bm, sum(nblocks), splits),
        in_specs=[pl.BlockSpec((n_in, bm, k_chunk), lambda m, n, s: (0, m, s))]
                 + [spec for i in range(len(Ns)) for spec in weight_specs(i)],
        out_specs=pl.BlockSpec((None, bm, bn), lambda m, n, s: (s, m, n)),
        # software pipelining of the switched weight loads overflows shared memory (336 KB at
        # 1.5b, M = 2): several segments stream unpipelined
        compiler_params=triton_params(num_warps=4, num_stages=3 if len(Ns) == 1 else 1),
        name="rwkv7_segment_linear",
        interpret=interpret,
    )(xs, *operands)
