"""The time-mix LoRA up-projections in one launch on Pallas Mosaic GPU, reading the down products
as split-K partials (``pallas_kernels.lora_up``'s contract; reference ``lora_up_reference``).

One program (one warpgroup) per 64 output columns: TMA copies bring, under one barrier, each
pair's down partials [splits, Mp, d_i] and its up weight block [64, d_i] into shared memory.
Per pair the partials are summed and rounded to the model dtype, passed through the pair's
activation (``time_mix.LORA_ACTIVATIONS``) and multiplied by the up block, one row at a time
(the block re-read from shared memory for each: fewer live registers): the block sits in the
WGMMA register layout (64 rows; its columns, the LoRA width, in pieces of at most 64, each a
multiple of 8, so widths such as 16, 48 or 96 need no padding), each row's activations in that
layout's column vectors, and a reduction along the columns gives the row's 64 outputs
(float32 accumulation). Rows M..Mp of the output are written as zeros (the consumers read rows
< M). Serves up to ``MAX_M`` rows, widths that are multiples of 8 up to 256 (TMA's box) and
C a multiple of 64, while the buffers fit ``SMEM_LIMIT``; else the Triton kernel runs
(``rwkv_jax.mosaic_ops``).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ..common import require
from ..segment_linear import sum_splits
from ..time_mix import LORA_ACTIVATIONS
from .common import TMA_BOX, interpret_params, tma_ok

F32 = jnp.float32
MAX_M = 16
BLOCK_C = 64      # output columns per program: the WGMMA layout's row block
PIECE = 64        # widest piece of a LoRA width multiplied at once
SMEM_LIMIT = 200 * 1024  # of an H200 SM's 227 KiB opt-in shared memory
ROW = plgpu.Layout.WGMMA.reduce(1)  # a vector over the up block's rows (outputs)
COL = plgpu.Layout.WGMMA.reduce(0)  # a vector over its columns (the LoRA width)


def smem_bytes(splits: int, Mp: int, C: int, widths, dtype) -> int:
    """Shared memory of one program: the pairs' partials, up blocks and output block."""
    del C
    item = jnp.dtype(dtype).itemsize
    return sum(splits * Mp * d * 4 + BLOCK_C * d * item for d in widths) + len(widths) * Mp * BLOCK_C * item


def supports(M: int, splits: int, Mp: int, C: int, widths, dtype) -> bool:
    """Whether the kernel serves these rows, widths and C (see module doc), each pair's partials
    copy a whole multiple of 128 bytes (``common.tma_ok``: one row of 16 float32 is not)."""
    return (1 <= M <= min(MAX_M, Mp) and Mp <= TMA_BOX and C % BLOCK_C == 0
            and all(d % 8 == 0 and d <= TMA_BOX and tma_ok(splits * Mp * d, 4) for d in widths)
            and smem_bytes(splits, Mp, C, widths, dtype) <= SMEM_LIMIT)


def _body(p_ref, *refs, offsets, widths, kinds, M, dtype):
    n = len(widths)
    u_refs, o_ref = refs[:n], refs[n]
    p_sms, u_sms, o_sm, bar = refs[n + 1:2 * n + 1], refs[2 * n + 1:3 * n + 1], refs[3 * n + 1], refs[3 * n + 2]
    c = jax.lax.axis_index("c")
    cols = pl.ds(c * BLOCK_C, BLOCK_C)
    for i in range(n):
        plgpu.copy_gmem_to_smem(p_ref.at[:, :, pl.ds(offsets[i], widths[i])], p_sms[i], bar)
        plgpu.copy_gmem_to_smem(u_refs[i].at[cols, :], u_sms[i], bar)
    plgpu.barrier_wait(bar)
    splits, Mp = p_sms[0].shape[:2]
    for i, (d, kind) in enumerate(zip(widths, kinds)):
        act = LORA_ACTIVATIONS[kind]
        for m in range(Mp):  # one row at a time (the up block re-read from shared memory): few live registers
            acc = plgpu.layout_cast(jnp.zeros((BLOCK_C,), F32), ROW)
            for start in range(0, d, PIECE) if m < M else ():
                piece = pl.ds(start, min(PIECE, d - start))
                u = plgpu.load(u_sms[i].at[:, piece], layout=plgpu.Layout.WGMMA, optimized=False).astype(F32)
                h = sum_splits(lambda s: plgpu.load(p_sms[i].at[s, m, piece], layout=COL, optimized=False),  # noqa: B023 - called in this iteration
                               splits, dtype)
                if act is not None:
                    h = act(h).astype(dtype).astype(F32)
                acc = acc + jnp.sum(u * jax.lax.broadcast_in_dim(h, u.shape, (1,)), axis=1)
            o_sm[i, m] = acc.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_sm, o_ref.at[:, :, cols])
    plgpu.wait_smem_to_gmem(0)


def lora_up(partials, ups, offsets, kinds, *, M: int, dtype, interpret: bool = False):
    """Mosaic GPU version of ``pallas_kernels.lora_up.lora_up`` (same arguments and result):
    partials float32 [splits, Mp, N_total] (the down products), ups [C, d_i] (dtype), offsets
    (column of each down product), kinds ("w"/"a"/"v"/"g") -> [n, Mp, C] in dtype (rows >= M
    zero). interpret: GPU interpret mode with race detection (``common.interpret_params``)."""
    splits, Mp, n_total = partials.shape
    C = ups[0].shape[0]
    widths = [u.shape[1] for u in ups]
    dtype = jnp.dtype(dtype)
    require(len(ups) == len(offsets) == len(kinds), "lora_up: one offset and kind per up weight")
    require(all(u.shape[0] == C and u.dtype == dtype for u in ups), f"lora_up: up weights must all be [C, d_i] {dtype}")
    require(all(o + d <= n_total for o, d in zip(offsets, widths)), "lora_up: offsets past the partials")
    require(supports(M, splits, Mp, C, widths, dtype),
            f"lora_up (Mosaic): unsupported M={M}, Mp={Mp}, C={C}, widths={widths}, splits={splits}")
    n = len(ups)
    scratch = ([plgpu.SMEM((splits, Mp, d), F32) for d in widths] + [plgpu.SMEM((BLOCK_C, d), dtype) for d in widths]
               + [plgpu.SMEM((n, Mp, BLOCK_C), dtype), plgpu.Barrier(num_arrivals=2 * n)])
    kernel = plgpu.kernel(
        functools.partial(_body, offsets=tuple(offsets), widths=tuple(widths), kinds=tuple(kinds), M=M, dtype=dtype),
        out_type=jax.ShapeDtypeStruct((n, Mp, C), dtype), grid=(C // BLOCK_C,), grid_names=("c",),
        scratch_types=tuple(scratch),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret_params(interpret), kernel_name="rwkv7_mosaic_lora_up")
    return kernel(partials, *ups)
