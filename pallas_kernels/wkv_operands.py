"""The wkv operands from the time-mix products over prefill rows, in one launch (XLA makes them
in three fusions): decay, ``a``, ``kk`` normalisation, the ``a`` key mix and the value mix
(``wkv_operands_reference``, built from the same helpers of ``time_mix``).

One program per (block of rows, head): it reads the head's N columns of the products (model
dtype), of v_first (float32) and of the vecs, and writes the six float32 operands [M, C] the
chunked wkv kernel reads (columns of head h: [h N, (h + 1) N), i.e. [M, H, N] reshaped).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .common import require, row_window, rows_per_program, triton_params
from .time_mix import in_context_rate, key_mix, log_decay, normalized_key, value_mix

F32 = jnp.float32
BLOCK_ROWS = 32  # rows per program (32 x 64 float32 tiles: 16 registers each at 4 warps)


def supports(C: int, n_head: int) -> bool:
    """Whether the kernel serves width C in n_head heads (a power-of-two head size >= 16)."""
    N = C // n_head
    return C == n_head * N and N >= 16 and N & (N - 1) == 0


def _kernel(*refs, first: bool, M: int, bm: int):
    if first:
        r_ref, k_ref, v_ref, wl_ref, al_ref, vec_ref, *outs = refs
    else:
        r_ref, k_ref, v_ref, wl_ref, al_ref, vl_ref, vf_ref, vec_ref, *outs = refs
    rows = row_window(pl.program_id(0), bm, M)
    load = lambda ref: ref[rows, :]  # noqa: E731
    vec = lambda i: vec_ref[jnp.int32(i)][None, :]  # noqa: E731  rows w0 a0 v0 k_k k_a
    k = load(k_ref).astype(F32)
    a = in_context_rate(vec(1), load(al_ref))
    v = load(v_ref).astype(F32)
    if not first:
        v = value_mix(v, load(vf_ref), vec(2), load(vl_ref))
    values = (load(r_ref).astype(F32), jnp.exp(log_decay(vec(0), load(wl_ref))), key_mix(k, a, vec(4)), v,
              normalized_key(k, vec(3)), a)
    for ref, x in zip(outs, values):
        ref[rows, :] = x


def wkv_operands(r, k, v, w_l, a_l, v_l, vecs, v_first, *, n_head: int, interpret: bool = False):
    """Pallas version of ``wkv_operands_reference`` (same arguments and results): products r, k,
    v, w_l, a_l, v_l (None on the first layer) [M, C], vecs [7, C] float32, v_first [M, C]
    float32 (None on the first layer) -> (r, w, k, v, kk, a, v_first) float32 [M, C]; on the
    first layer v_first is the v written (the value product in float32)."""
    first = v_first is None
    M, C = r.shape
    require(supports(C, n_head), f"wkv_operands: width {C} in {n_head} heads needs a power-of-two head size >= 16")
    require((v_l is None) == first, "wkv_operands: v_l and v_first come together (absent on the first layer)")
    inputs = {"r": r, "k": k, "v": v, "w_l": w_l, "a_l": a_l} | ({} if first else {"v_l": v_l, "v_first": v_first})
    for name, x in inputs.items():
        require(x.shape == (M, C), f"wkv_operands: {name} must be [M, C]={M, C}, got {x.shape}")
    require(vecs.shape == (7, C) and vecs.dtype == F32, f"wkv_operands: vecs must be float32 [7, {C}], got "
            f"{vecs.dtype} {vecs.shape}")
    N = C // n_head
    bm = rows_per_program(M, BLOCK_ROWS)
    head = pl.BlockSpec((M, N), lambda i, h: (0, h))
    outs = pl.pallas_call(
        functools.partial(_kernel, first=first, M=M, bm=bm),
        out_shape=tuple(jax.ShapeDtypeStruct((M, C), F32) for _ in range(6)),
        grid=(pl.cdiv(M, bm), n_head),
        in_specs=[head] * len(inputs) + [pl.BlockSpec((7, N), lambda i, h: (0, h))],
        out_specs=tuple([head] * 6),
        name="rwkv7_wkv_operands",
        compiler_params=triton_params(num_warps=4),
        interpret=interpret,
    )(*inputs.values(), vecs)
    return (*outs, outs[3] if first else v_first)
