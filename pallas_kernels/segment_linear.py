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
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import next_pow2, pow2_divisor, require, triton_params
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


def supports(M: int, Ns, K: int) -> bool:
    """Whether the kernel serves M rows, segment widths Ns and depth K (else use the reference)."""
    return (1 <= M <= MAX_M and pow2_divisor(K, MAX_BLOCK_K) >= MIN_BLOCK
            and min(pow2_divisor(n, MAX_BLOCK_N) for n in Ns) >= MIN_BLOCK)


def _blocks(M, Ns, K, dtype):
    bm = row_block(M)
    bn = min(pow2_divisor(n, MAX_BLOCK_N) for n in Ns)
    cap = MAX_BLOCK_K if (bm == 1 or jnp.dtype(dtype) != jnp.float32) else MAX_BLOCK_K_F32_DOT
    bk = pow2_divisor(K, min(cap, 128 if bm >= 64 else cap))
    return bm, bn, bk


def choose_splits(blocks: int, tiles: int, target: int = TARGET_PROGRAMS) -> int:
    """Smallest divisor s of the K tiles with blocks * s >= target (all tiles if none)."""
    for s in range(1, tiles + 1):
        if tiles % s == 0 and blocks * s >= target:
            return s
    return tiles


def _kernel(*refs, starts, inputs, M, tiles, bk, vector):
    n_seg = len(inputs)
    x_ref, w_refs, o_ref = refs[0], refs[1:1 + n_seg], refs[-1]
    n = pl.program_id(1)
    seg = sum((n >= s).astype(jnp.int32) for s in starts[1:])
    mix = sum(jnp.where(seg == i, jnp.int32(j), jnp.int32(0)) for i, j in enumerate(inputs))
    bm = o_ref.shape[0]
    row_ok = (pl.program_id(0) * bm + jnp.arange(bm)) < M

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
    require(all(w.shape == (n, K) and w.dtype == xs.dtype for w, n in zip(weights, Ns)),
            f"segment_linear: weights must be [N_i, K={K}] in {xs.dtype}")
    require(supports(M, Ns, K), f"segment_linear: unsupported M={M}, N={Ns}, K={K}")
    bm, bn, bk = _blocks(M, Ns, K, xs.dtype)
    Mp = padded_rows(M)
    nblocks = [n // bn for n in Ns]
    starts = [sum(nblocks[:i]) for i in range(len(Ns))]
    tiles = K // bk
    splits = splits or choose_splits((Mp // bm) * sum(nblocks), tiles, target)
    require(tiles % splits == 0, f"segment_linear: splits={splits} must divide {tiles}")
    k_chunk = K // splits

    def weight_spec(i):
        first, count = starts[i], nblocks[i]
        return pl.BlockSpec((bn, k_chunk), lambda m, n, s: (jnp.clip(n - first, 0, count - 1), s))

    return pl.pallas_call(
        functools.partial(_kernel, starts=starts, inputs=tuple(inputs), M=M, tiles=k_chunk // bk, bk=bk,
                          vector=bm == 1),
        out_shape=jax.ShapeDtypeStruct((splits, Mp, sum(Ns)), jnp.float32),
        grid=(Mp // bm, sum(nblocks), splits),
        in_specs=[pl.BlockSpec((n_in, bm, k_chunk), lambda m, n, s: (0, m, s))]
                 + [weight_spec(i) for i in range(len(Ns))],
        out_specs=pl.BlockSpec((None, bm, bn), lambda m, n, s: (s, m, n)),
        # software pipelining of the switched weight loads overflows shared memory (336 KB at
        # 1.5b, M = 2): several segments stream unpipelined
        compiler_params=triton_params(num_warps=4, num_stages=3 if len(Ns) == 1 else 1),
        name="rwkv7_segment_linear",
        interpret=interpret,
    )(xs, *weights)
