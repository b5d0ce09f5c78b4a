"""The time-mix LoRA up-projections in one launch, reading the down products as split-K partials.

The down products (``segment_linear``'s partials [splits, Mp, N_total]; segment i at columns
[offsets[i], offsets[i] + d_i)) are summed and rounded to the model dtype, passed through each
pair's activation (tanh for the decay, none for ``a`` and the value mix, sigmoid for the gate)
and multiplied by the up weights ups[i] [C, d_i]: out [n, Mp, C] in the model dtype (the
products ``lora_up_reference`` returns). Grid (C blocks, row blocks); every program loops over
the n pairs, so one launch serves all of them, and multiplies each pair in pieces of the LoRA
width (``chunks``: at most 128 columns, fewer for taller row blocks) accumulated in float32, so
no tile outgrows the registers. The widths d_i need not be powers of two: the last piece is
rounded up and its loads are masked.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import next_pow2, pow2_divisor, require, triton_params
from .segment_linear import row_block, sum_splits
from .time_mix import LORA_ACTIVATIONS

BLOCK_C = 16  # output columns per program (C / 16 programs per row block)
MAX_CHUNK = 128            # widest piece of a LoRA width multiplied at once
MAX_CHUNK_ELEMENTS = 2048  # elements of a piece's summed partials (row block x width)


def supports(C: int, widths) -> bool:
    return pow2_divisor(C, BLOCK_C) == BLOCK_C and min(widths) >= 16


def chunks(d: int, cap: int) -> list[tuple[int, int]]:
    """(start, width) pieces covering [0, d): cap-wide ones, then the rest rounded up to a power
    of two (>= 16; the loads mask columns >= d)."""
    out = [(s, cap) for s in range(0, d - d % cap, cap)]
    if d % cap:
        out.append((d - d % cap, max(16, next_pow2(d % cap))))
    return out


def max_chunk(bm: int) -> int:
    """Widest piece for row blocks of bm (1..64): its summed partials float32 [bm, width] stay
    within MAX_CHUNK_ELEMENTS (whole widths spilled in bf16: [16, 256] at 1.5b 24 B, [16..64, 512]
    at 2.9b 1.4-8.5 KB)."""
    return min(MAX_CHUNK, MAX_CHUNK_ELEMENTS // bm)


def _kernel(p_ref, *refs, offsets, widths, kinds, splits, M, dtype):
    w_refs, o_ref = refs[:-1], refs[-1]
    bm = o_ref.shape[1]
    vector = bm == 1
    for i, (off, d, kind) in enumerate(zip(offsets, widths, kinds)):
        act = LORA_ACTIVATIONS[kind]
        out = jnp.zeros((bm, BLOCK_C), jnp.float32)
        for start, width in chunks(d, max_chunk(bm)):
            col_ok = start + jnp.arange(width) < d
            h = sum_splits(lambda s: plgpu_triton.load(p_ref.at[s, :, pl.ds(off + start, width)],  # noqa: B023 - called in this iteration
                                                       mask=col_ok[None, :], other=0), splits, dtype)  # noqa: B023 - called in this iteration
            if act is not None:
                h = act(h).astype(dtype).astype(jnp.float32)
            w = plgpu_triton.load(w_refs[i].at[:, pl.ds(start, width)], mask=col_ok[None, :], other=0)
            if vector:
                out = out + jnp.sum(w.astype(jnp.float32) * h, axis=1)[None, :]
            else:
                exact = False if dtype == jnp.float32 else None
                out = out + plgpu_triton.dot(h.astype(dtype), w, trans_b=True, allow_tf32=exact)
        o_ref[jnp.int32(i)] = out.astype(o_ref.dtype)


def lora_up(partials, ups, offsets, kinds, *, M: int, dtype, interpret: bool = False):
    """Pallas: partials float32 [splits, Mp, N_total] (the down products, see module doc), ups
    [C, d_i] (model dtype), offsets (column of each down product), kinds ("w"/"a"/"v"/"g")
    -> [n, Mp, C] in dtype (rows >= M are padding)."""
    splits, Mp, n_total = partials.shape
    C = ups[0].shape[0]
    widths = [u.shape[1] for u in ups]
    require(len(ups) == len(offsets) == len(kinds), "lora_up: one offset and kind per up weight")
    require(all(u.shape[0] == C for u in ups), "lora_up: up weights must all be [C, d_i]")
    require(supports(C, widths), f"lora_up: unsupported C={C}, widths={widths}")
    require(all(o + d <= n_total for o, d in zip(offsets, widths)), "lora_up: offsets past the partials")
    bm = row_block(M)
    require(Mp % bm == 0, f"lora_up: partials rows {Mp} must be a multiple of {bm}")
    width = next_pow2(max(o + next_pow2(d) for o, d in zip(offsets, widths)))
    n = len(ups)
    return pl.pallas_call(
        functools.partial(_kernel, offsets=tuple(offsets), widths=tuple(widths), kinds=tuple(kinds),
                          splits=splits, M=M, dtype=jnp.dtype(dtype)),
        out_shape=jax.ShapeDtypeStruct((n, Mp, C), dtype),
        grid=(C // BLOCK_C, Mp // bm),
        in_specs=[pl.BlockSpec((splits, bm, width), lambda c, m: (0, m, 0))]
                 + [pl.BlockSpec((BLOCK_C, next_pow2(d)), lambda c, m: (c, 0)) for d in widths],
        out_specs=pl.BlockSpec((n, bm, BLOCK_C), lambda c, m: (0, m, c)),
        compiler_params=triton_params(num_warps=4, num_stages=1),
        name="rwkv7_lora_up",
        interpret=interpret,
    )(partials, *ups)
