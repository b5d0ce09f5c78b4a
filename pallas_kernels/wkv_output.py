"""GroupNorm per head + bonus + gate after the wkv recurrence over prefill rows, in one launch
(``wkv_output_reference``, built from the same helpers of ``time_mix``; XLA makes it in one to
two fusions).

One program per (block of rows, head): the head's y [bm, N] (float32, from the chunked kernel),
r, k, v [bm, N] (float32 operands) and gate g [bm, N] (model dtype) -> out [bm, N] in the model
dtype, which the output projection reads.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .common import require, row_window, rows_per_program, triton_params
from .time_mix import bonus, head_norm
from .wkv_operands import BLOCK_ROWS, supports

F32 = jnp.float32


def _kernel(y_ref, r_ref, k_ref, v_ref, g_ref, vec_ref, rk_ref, o_ref, *, M: int, bm: int):
    rows = row_window(pl.program_id(0), bm, M)
    load = lambda ref: ref[rows, :]  # noqa: E731
    vec = lambda i: vec_ref[jnp.int32(i)][None, :]  # noqa: E731
    y = head_norm(load(y_ref)) * vec(5) + vec(6)
    y = y + bonus(load(r_ref), load(k_ref), rk_ref[...][None, :], load(v_ref))
    o_ref[rows, :] = (y * load(g_ref).astype(F32)).astype(o_ref.dtype)


def wkv_output(y, r, k, v, g, vecs, r_k, dtype, *, interpret: bool = False):
    """Pallas version of ``wkv_output_reference`` (same arguments and result): y [M, H, N]
    float32, r, k, v [M, C] float32, g [M, C], vecs [7, C] float32, r_k [H, N] float32 -> [M, C]
    in dtype."""
    M, H, N = y.shape
    C = H * N
    require(supports(C, H), f"wkv_output: head size {N} must be a power of two >= 16")
    for name, x in (("r", r), ("k", k), ("v", v), ("g", g)):
        require(x.shape == (M, C), f"wkv_output: {name} must be [M, C]={M, C}, got {x.shape}")
    require(vecs.shape == (7, C) and r_k.shape == (H, N), f"wkv_output: vecs must be [7, {C}] and r_k "
            f"[{H}, {N}], got {vecs.shape} and {r_k.shape}")
    bm = rows_per_program(M, BLOCK_ROWS)
    head = pl.BlockSpec((M, N), lambda i, h: (0, h))
    return pl.pallas_call(
        functools.partial(_kernel, M=M, bm=bm),
        out_shape=jax.ShapeDtypeStruct((M, C), dtype),
        grid=(pl.cdiv(M, bm), H),
        in_specs=[pl.BlockSpec((M, None, N), lambda i, h: (0, h, 0)), head, head, head, head,
                  pl.BlockSpec((7, N), lambda i, h: (0, h)), pl.BlockSpec((None, N), lambda i, h: (h, 0))],
        out_specs=head,
        name="rwkv7_wkv_output",
        compiler_params=triton_params(num_warps=4),
        interpret=interpret,
    )(y, r, k, v, g, vecs, r_k)
