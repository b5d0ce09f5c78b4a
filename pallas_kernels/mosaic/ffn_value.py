"""The channel-mix value product on Pallas Mosaic GPU, reading the key product's split-K partials
(``pallas_kernels.ffn_value``'s contract without ``skip``; reference ``ffn_value_reference``).

Grid (C blocks, F splits), one warpgroup a program: an ``emit_pipeline`` over the F tiles of its
split (depth from the shared-memory budget, ``common.pipeline_depth``) brings by TMA the key
partials [splits_in, Mp, bf] and the value weight tile [bf, bc]; each row's hidden units
(``relu_square`` of the summed partials: float32, rounded to the model dtype, float16 kept
float32) multiply the tile in the WGMMA register layout (bf rows, a multiple of 64; bc columns,
a multiple of 8) into one float32 accumulator tile per row, reduced over F after the last
tile; rows M..Mp of the float32 partials [splits, Mp, C] are zeros. Every unit's weight row is
read (the dense product, bit-identical to the skipping one); skipping the rows of zero units is
a data-dependent load a pipeline of static TMA tiles does not express, so ``skip`` and quantized
value weights run the Triton kernel (``rwkv_jax.mosaic_ops``). Up to ``MAX_M`` rows.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ..common import pow2_divisor, require
from ..quantized import QuantizedWeight
from ..segment_linear import TARGET_PROGRAMS, choose_splits, padded_rows, sum_splits
from ..sparse_channel_mix import relu_square
from .common import COL, ROW, accumulate_rows, fit_tile, interpret_params, pipeline_depth, release_slot, tma_ok, zeros

F32 = jnp.float32
MAX_M = 16
MAX_BLOCK_F = 256  # TMA's box
MIN_BLOCK_F = 64   # a WGMMA-layout row block
MAX_BLOCK_C = 64
MIN_BLOCK_C = 8


def supports(M: int, F: int, C: int, w_val_t=None, skip: bool = False) -> bool:
    """Whether the kernel serves M rows of F units and C outputs with this value weight (plain
    [F, C]; quantized ones and `skip` take the Triton kernel), its TMA copies whole multiples
    of 128 bytes (``common.tma_ok``)."""
    if not (1 <= M <= MAX_M and not skip and not isinstance(w_val_t, QuantizedWeight)
            and pow2_divisor(F, MAX_BLOCK_F) >= MIN_BLOCK_F and pow2_divisor(C, MAX_BLOCK_C) >= MIN_BLOCK_C):
        return False
    _, bc = blocks(M, F, C)
    return tma_ok(padded_rows(M) * bc, 4)  # the output block [Mp, bc] float32


def blocks(M: int, F: int, C: int) -> tuple[int, int]:
    """(bf, bc): F tile and output columns of a program (``common.fit_tile``)."""
    return fit_tile(M, pow2_divisor(F, MAX_BLOCK_F), pow2_divisor(C, MAX_BLOCK_C), MIN_BLOCK_F, MIN_BLOCK_C)


def _body(p_ref, w_ref, o_ref, o_sm, *, M, tiles, bf, bc, depth, dtype):
    c, s = jax.lax.axis_index("c"), jax.lax.axis_index("s")
    splits_in = p_ref.shape[0]

    def step(_, p_sm, w_sm, accs):
        w = plgpu.load(w_sm, layout=plgpu.Layout.WGMMA, optimized=False).astype(F32)  # [bf, bc]
        hidden = [relu_square(sum_splits(lambda k: plgpu.load(p_sm.at[k, m], layout=ROW, optimized=False),  # noqa: B023 - called in this iteration
                                         splits_in), dtype).astype(F32) for m in range(M)]
        accs = accumulate_rows(accs, w, hidden)
        release_slot()
        return accs

    pipeline = plgpu.emit_pipeline(
        step, grid=(tiles,), max_concurrent_steps=depth, init_carry=(zeros((bf, bc), plgpu.Layout.WGMMA),) * M,
        in_specs=[plgpu.BlockSpec((splits_in, M, bf), lambda t: (0, 0, s * tiles + t)),
                  plgpu.BlockSpec((bf, bc), lambda t: (s * tiles + t, c))])
    accs = pipeline(p_ref.at[:, pl.ds(0, M), :], w_ref)
    for m in range(o_sm.shape[0]):
        o_sm[m] = jnp.sum(accs[m], axis=0) if m < M else zeros((bc,), COL)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_sm, o_ref.at[s, :, pl.ds(c * bc, bc)])
    plgpu.wait_smem_to_gmem(0)


def ffn_value(pre_partials, w_val_t, *, M: int, dtype, splits: int | None = None, skip: bool = False,
              interpret: bool = False):
    """Mosaic GPU version of ``pallas_kernels.ffn_value.ffn_value`` (dense; same arguments and
    result): pre_partials float32 [splits_in, Mp_in, F] (the key product, M real rows), w_val_t
    [F, C] (dtype) -> value partials float32 [splits, Mp, C] (Mp = ``padded_rows(M)``, rows >= M
    zero). skip must be False (see module doc). interpret: GPU interpret mode with race
    detection (``common.interpret_params``)."""
    splits_in, Mp_in, F = pre_partials.shape
    require(not isinstance(w_val_t, QuantizedWeight) and w_val_t.ndim == 2 and w_val_t.shape[0] == F,
            f"ffn_value (Mosaic): the value weight must be a plain [F={F}, C] array")
    C = w_val_t.shape[1]
    require(M <= Mp_in and supports(M, F, C, w_val_t, skip),
            f"ffn_value (Mosaic): unsupported M={M}, F={F}, C={C}, skip={skip}")
    bf, bc = blocks(M, F, C)
    tiles = F // bf
    splits = splits or choose_splits(C // bc, tiles, TARGET_PROGRAMS)
    require(tiles % splits == 0, f"ffn_value: splits={splits} must divide {tiles}")
    step_bytes = splits_in * M * bf * 4 + bf * bc * w_val_t.dtype.itemsize
    Mp = padded_rows(M)
    kernel = plgpu.kernel(
        functools.partial(_body, M=M, tiles=tiles // splits, bf=bf, bc=bc,
                          depth=pipeline_depth(step_bytes, tiles // splits), dtype=jnp.dtype(dtype)),
        out_type=jax.ShapeDtypeStruct((splits, Mp, C), F32), grid=(C // bc, splits), grid_names=("c", "s"),
        scratch_types=(plgpu.SMEM((Mp, bc), F32),),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret_params(interpret), kernel_name="rwkv7_mosaic_ffn_value")
    return kernel(pre_partials, w_val_t)
