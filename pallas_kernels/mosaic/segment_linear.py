"""Several small-M products x_i @ w_i.T in one weight-streaming split-K launch on Pallas Mosaic
GPU (``pallas_kernels.segment_linear``'s contract for plain weights, its reference
``segment_linear_reference``): the decode time-mix's r, k, v and LoRA downs, the output
projection, the FFN key, the head.

Grid (output blocks over all segments, K splits), one warpgroup a program. A program finds its
segment from its output block and runs that segment's ``emit_pipeline`` over the K tiles of its
split: TMA copies of the input rows [M, bk] (``xs[inputs[i]]``, read in place) and of the weight
tile [bn, bk], as many stages in flight as the shared-memory budget holds
(``common.pipeline_depth``). The weight tile is read as its transpose [bk, bn] in the WGMMA
register layout (bk rows: a multiple of 64; bn columns: a multiple of 8, so segment widths
need only share a power-of-two divisor >= 8 such as 16 or 32, not 64), each input row in that
layout's row vectors; the product is a CUDA-core multiply-add into one [bk, bn] float32 tile
per row (exact for float32 too: no TF32), reduced over K once after the last tile; the tiles
are sized so the rows' accumulators fit the registers (``blocks``, ``common.fit_tile``). Rows
M..Mp of the float32 partials [splits, Mp, sum N_i] are written as zeros (Mp =
``padded_rows(M)``, what the Triton consumers expect). Up to ``MAX_M`` rows: beyond, a
tensor-core product pays off and the Triton kernel runs (``rwkv_jax.mosaic_ops``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ..common import pow2_divisor, require
from ..quantized import QuantizedWeight
from ..segment_linear import TARGET_PROGRAMS, choose_splits, padded_rows
from .common import COL, ROW, accumulate_rows, fit_tile, interpret_params, pipeline_depth, release_slot, tma_ok, zeros

F32 = jnp.float32
MAX_M = 16       # rows served (one accumulator vector per row in registers)
MAX_BLOCK_N = 64
MIN_BLOCK_N = 8  # a WGMMA-layout column block
MAX_BLOCK_K = 256  # TMA's box
MIN_BLOCK_K = 64   # a WGMMA-layout row block


def supports(M: int, Ns, K: int, weights=()) -> bool:
    """Whether the kernel serves M rows, segment widths Ns, depth K and these weights (plain
    bfloat16 / float16 / float32 arrays; quantized ones take the Triton kernel), its TMA copies
    whole multiples of 128 bytes (``common.tma_ok``)."""
    if not (1 <= M <= MAX_M and pow2_divisor(K, MAX_BLOCK_K) >= MIN_BLOCK_K
            and min(pow2_divisor(n, MAX_BLOCK_N) for n in Ns) >= MIN_BLOCK_N
            and not any(isinstance(w, QuantizedWeight) for w in weights)):
        return False
    bn, _ = blocks(M, Ns, K)
    return tma_ok(padded_rows(M) * bn, 4)  # the output block [Mp, bn] float32 (one row of 16 columns is not)


def _body(*refs, starts, nblocks, inputs, M, tiles, bn, bk, depth):
    n_seg = len(inputs)
    x_ref, w_refs, o_ref, o_sm = refs[0], refs[1:1 + n_seg], refs[1 + n_seg], refs[2 + n_seg]
    n, s = jax.lax.axis_index("n"), jax.lax.axis_index("s")
    seg = sum((n >= st).astype(jnp.int32) for st in starts[1:])

    def step(_, x_sm, w_sm, accs):
        wt = plgpu.load(w_sm.T, layout=plgpu.Layout.WGMMA, optimized=False).astype(F32)  # [bk, bn]
        accs = accumulate_rows(accs, wt, [plgpu.load(x_sm.at[m], layout=ROW, optimized=False).astype(F32)
                                          for m in range(M)])
        release_slot()
        return accs

    zero = zeros((bk, bn), plgpu.Layout.WGMMA)
    for i in range(n_seg):
        @pl.when(seg == i)
        def _(i=i):
            block = n - starts[i]
            pipeline = plgpu.emit_pipeline(
                step, grid=(tiles,), max_concurrent_steps=depth, init_carry=(zero,) * M,
                in_specs=[plgpu.BlockSpec((M, bk), lambda t: (0, s * tiles + t)),
                          plgpu.BlockSpec((bn, bk), lambda t: (block, s * tiles + t))])
            accs = pipeline(x_ref.at[inputs[i]], w_refs[i])
            for m in range(M):
                o_sm[m] = jnp.sum(accs[m], axis=0)
            for m in range(M, o_sm.shape[0]):  # the padded rows of the partials
                o_sm[m] = zeros((bn,), COL)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_sm, o_ref.at[s, :, pl.ds(n * bn, bn)])
            plgpu.wait_smem_to_gmem(0)
    del nblocks


def blocks(M: int, Ns, K: int) -> tuple[int, int]:
    """(bn, bk): output columns and K tile of a program, as wide as the M accumulator tiles
    [bk, bn] allow (``common.MAX_ACC_ELEMENTS``): bk first narrowed to 64, then bn to 8."""
    bk, bn = fit_tile(M, pow2_divisor(K, MAX_BLOCK_K), min(pow2_divisor(n, MAX_BLOCK_N) for n in Ns),
                      MIN_BLOCK_K, MIN_BLOCK_N)
    return bn, bk


def segment_linear(xs, weights, inputs, *, splits: int | None = None, target: int = TARGET_PROGRAMS,
                   interpret: bool = False):
    """Mosaic GPU version of ``pallas_kernels.segment_linear.segment_linear`` for plain weights:
    xs [n_in, M, K], weights [w_i [N_i, K]] in xs.dtype, inputs [index into xs per segment] ->
    partials float32 [splits, Mp, sum N_i] (sum over axis 0, rows [:M]: the concatenated
    products; rows >= M zero). splits: the K splits (default: the fewest giving >= `target`
    programs). interpret: GPU interpret mode with race detection (``common.interpret_params``)."""
    n_in, M, K = xs.shape
    Ns = [w.shape[0] for w in weights]
    require(len(weights) == len(inputs) and all(0 <= j < n_in for j in inputs),
            "segment_linear: one input index in range per weight")
    require(all(not isinstance(w, QuantizedWeight) and w.shape == (n, K) and w.dtype == xs.dtype
                for w, n in zip(weights, Ns)),
            f"segment_linear (Mosaic): weights must be plain [N_i, K={K}] in {xs.dtype}")
    require(supports(M, Ns, K, weights), f"segment_linear (Mosaic): unsupported M={M}, N={Ns}, K={K}")
    bn, bk = blocks(M, Ns, K)
    Mp = padded_rows(M)
    nblocks = [n // bn for n in Ns]
    starts = [sum(nblocks[:i]) for i in range(len(Ns))]
    tiles = K // bk
    splits = splits or choose_splits(sum(nblocks), tiles, target)
    require(tiles % splits == 0, f"segment_linear: splits={splits} must divide {tiles}")
    step_bytes = (M + bn) * bk * xs.dtype.itemsize
    depth = pipeline_depth(step_bytes, tiles // splits)
    kernel = plgpu.kernel(
        functools.partial(_body, starts=tuple(starts), nblocks=tuple(nblocks), inputs=tuple(inputs), M=M,
                          tiles=tiles // splits, bn=bn, bk=bk, depth=depth),
        out_type=jax.ShapeDtypeStruct((splits, Mp, sum(Ns)), F32),
        grid=(sum(nblocks), splits), grid_names=("n", "s"), scratch_types=(plgpu.SMEM((Mp, bn), F32),),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret_params(interpret), kernel_name="rwkv7_mosaic_segment_linear")
    return kernel(xs, *weights)
