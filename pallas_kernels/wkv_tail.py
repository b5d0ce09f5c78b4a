"""The decode time-mix from its products to the gated output in one launch: wkv operands
(decay, ``a``, ``kk`` normalisation, the key and value mixes), the wkv7 step with the state
updated in place, GroupNorm, the bonus and the gate. One program per (row, head).

Reads the receptance/key/value products as ``segment_linear`` partials [splits, Mp, >= 3C]
(columns [0, C), [C, 2C), [2C, 3C)) and the LoRA outputs ``lora_up`` writes [n, Mp, C] (order
w, a, [v,] g); the state is either one layer's rows [B, H, N, N] or the whole [B, L, H, N, N]
with ``layer`` naming the block to update (read and written in place, nothing sliced out), in
any state dtype (``common.STATE_DTYPES``: read into float32, rounded back where stored).
Same math as ``wkv_tail_reference``: ``wkv_operands_reference`` -> ``wkv_step_reference`` ->
``wkv_output_reference`` (the operand and output pieces from the same ``time_mix`` helpers).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .common import is_state_dtype, require, triton_params
from .segment_linear import sum_splits
from .time_mix import (
    bonus,
    head_norm,
    in_context_rate,
    key_mix,
    log_decay,
    normalized_key,
    value_mix,
    wkv_operands_reference,
    wkv_output_reference,
)
from .wkv_step import wkv_step_reference

F32 = jnp.float32


def wkv_tail_reference(r, k, v, w_l, a_l, v_l, g, vecs, r_k, v_first, S):
    """Plain-jnp: products r, k, v and LoRA outputs w_l, a_l, v_l (None on the first layer), g
    [M, C] (model dtype), vecs [7, C], r_k [H, N], v_first [M, C] float32 | None, S [M, H, N, N]
    -> (out [M, C] in r.dtype, S', v_first)."""
    M, C = r.shape
    H, N = r_k.shape
    dtype = g.dtype
    r, w, k, v, kk, a, v_first = wkv_operands_reference(r, k, v, w_l, a_l, v_l, vecs, v_first, n_head=H)
    y, S = wkv_step_reference(*(x.reshape(M, H, N) for x in (r, w, k, v, kk, a)), S)
    return wkv_output_reference(y, r, k, v, g, vecs, r_k, dtype), S, v_first


def _kernel(*refs, first: bool, splits: int, dtype):
    if first:
        pr, pk, pv, l_ref, vec_ref, rk_ref, s_ref, o_ref, s_out_ref, vf_out_ref = refs
    else:
        pr, pk, pv, l_ref, vec_ref, rk_ref, vf_ref, s_ref, o_ref, s_out_ref = refs
    product = lambda ref: sum_splits(lambda s: ref[s], splits, dtype)  # noqa: E731
    lora = lambda i: l_ref[jnp.int32(i)].astype(F32)  # noqa: E731
    vec = lambda i: vec_ref[jnp.int32(i)]  # noqa: E731
    r, k, v = product(pr), product(pk), product(pv)
    w = jnp.exp(log_decay(vec(0), lora(0)))
    a = in_context_rate(vec(1), lora(1))
    g = lora(3 - first)
    kk = normalized_key(k, vec(3))
    k = key_mix(k, a, vec(4))
    if first:
        vf_out_ref[...] = v
    else:
        v = value_mix(v, vf_ref[...], vec(2), lora(2))
    S = s_ref[...].astype(F32)
    sa = jnp.sum(S * (-kk)[None, :], axis=1)
    S = S * w[None, :] + sa[:, None] * (kk * a)[None, :] + v[:, None] * k[None, :]
    s_out_ref[...] = S.astype(s_out_ref.dtype)
    y = jnp.sum(S * r[None, :], axis=1)
    y = head_norm(y) * vec(5) + vec(6)
    y = y + bonus(r, k, rk_ref[...], v)
    o_ref[...] = (y * g).astype(o_ref.dtype)


def wkv_tail(partials, lora, vecs, r_k, v_first, S, *, layer: int | None = None, interpret: bool = False):
    """Pallas version of `wkv_tail_reference` on the fused kernels' layouts (module doc).

    partials float32 [splits, Mp, >= 3C]; lora [n, Mp, C] (model dtype; n = 3 on the first layer
    (v_first None), else 4); vecs [7, C], r_k [H, N] float32; v_first [M, C] float32 | None; S
    float32 [B, H, N, N], or [B, L, H, N, N] with `layer`; M = B rows.
    Returns (out [M, C] model dtype, S' (aliased to S, same shape), v_first [M, C] float32)."""
    splits, Mp, _ = partials.shape
    n, _, C = lora.shape
    H, N = r_k.shape
    first = v_first is None
    M = B = S.shape[0]
    dtype = lora.dtype
    require(n == (3 if first else 4), f"wkv_tail: {n} LoRA outputs, expected {3 if first else 4}")
    require(C == H * N and vecs.shape == (7, C), f"wkv_tail: vecs must be [7, {C}], r_k [H, N]")
    state_shape = (B, H, N, N) if layer is None else (B, S.shape[1], H, N, N)
    require(S.shape == state_shape and is_state_dtype(S.dtype) and M <= Mp,
            f"wkv_tail: S must be float32, bfloat16 or float16 {state_shape}, got {S.dtype} {S.shape}")
    require(N & (N - 1) == 0, f"wkv_tail: head size N={N} must be a power of two")
    product = lambda seg: pl.BlockSpec((splits, None, N), lambda b, h: (0, b, seg * H + h))  # noqa: E731
    row = pl.BlockSpec((None, N), lambda b, h: (b, h))
    if layer is None:
        state = pl.BlockSpec((None, None, N, N), lambda b, h: (b, h, 0, 0))
    else:
        state = pl.BlockSpec((None, None, None, N, N), lambda b, h: (b, layer, h, 0, 0))
    in_specs = [product(0), product(1), product(2), pl.BlockSpec((n, None, N), lambda b, h: (0, b, h)),
                pl.BlockSpec((7, N), lambda b, h: (0, h)), pl.BlockSpec((None, N), lambda b, h: (h, 0))]
    inputs = [partials, partials, partials, lora, vecs, r_k]
    if not first:
        in_specs.append(row)
        inputs.append(v_first)
    in_specs.append(state)
    inputs.append(S)
    out_shape = [jax.ShapeDtypeStruct((M, C), dtype), jax.ShapeDtypeStruct(S.shape, S.dtype)]
    out_specs = [row, state]
    if first:
        out_shape.append(jax.ShapeDtypeStruct((M, C), F32))
        out_specs.append(row)
    outs = pl.pallas_call(
        functools.partial(_kernel, first=first, splits=splits, dtype=jnp.dtype(dtype)),
        out_shape=tuple(out_shape),
        grid=(M, H),
        in_specs=in_specs,
        out_specs=tuple(out_specs),
        input_output_aliases={len(inputs) - 1: 1},
        name="rwkv7_wkv_tail",
        compiler_params=triton_params(num_warps=4),
        interpret=interpret,
    )(*inputs)
    return (outs[0], outs[1], outs[2]) if first else (outs[0], outs[1], v_first)
