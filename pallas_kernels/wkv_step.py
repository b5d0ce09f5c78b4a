"""wkv7 decode step (T = 1): one Pallas program per (sequence, head), state updated in place.

Per head, with vectors of width N and S [N, N] (rows = value dim i, cols = key dim j):
    S' = S * w[None, :] + (S @ -kk)[:, None] * (kk * a)[None, :] + v[:, None] * k[None, :]
    y  = S' @ r
The state may be held in float32, bfloat16 or float16 (``common.STATE_DTYPES``): it is read
into float32, updated in float32 and rounded back to its dtype where it is stored. With
``layer`` the kernel takes the whole state leaf [B, L, H, N, N] and updates that layer's
blocks in place (no slice copied out and back).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .common import is_state_dtype, require, triton_params

_HIGHEST = jax.lax.Precision.HIGHEST
F32 = jnp.float32


def wkv_step_reference(r, w, k, v, kk, a, S):
    """Plain-jnp step (the model's XLA op). r, w, k, v, kk, a: [B, H, N] float32; S: [B, H, N, N]
    in a state dtype (read as float32). Returns (y [B, H, N] float32, S' [B, H, N, N] in S's dtype)."""
    dtype, S = S.dtype, S.astype(F32)
    sa = jnp.einsum("bhij,bhj->bhi", S, -kk, precision=_HIGHEST)
    S = S * w[:, :, None, :] + sa[..., None] * (kk * a)[:, :, None, :] + v[..., None] * k[:, :, None, :]
    y = jnp.einsum("bhij,bhj->bhi", S, r, precision=_HIGHEST)
    return y, S.astype(dtype)


def _step_kernel(r_ref, w_ref, k_ref, v_ref, kk_ref, a_ref, s_ref, y_ref, s_out_ref):
    S = s_ref[...].astype(F32)
    kk = kk_ref[...]
    sa = jnp.sum(S * (-kk)[None, :], axis=1)
    S = (S * w_ref[...][None, :] + sa[:, None] * (kk * a_ref[...])[None, :]
         + v_ref[...][:, None] * k_ref[...][None, :])
    s_out_ref[...] = S.astype(s_out_ref.dtype)
    y_ref[...] = jnp.sum(S * r_ref[...][None, :], axis=1)


def wkv_step(r, w, k, v, kk, a, S, *, layer: int | None = None, interpret: bool = False):
    """Pallas step with the same contract as `wkv_step_reference`; S is aliased to S'. With
    `layer`, S is the whole leaf [B, L, H, N, N] and S' that leaf with layer `layer` stepped.

    N must be a power of two (64 in every released model) for the Triton lowering.
    """
    B, H, N = r.shape
    vec = pl.BlockSpec((None, None, N), lambda b, h: (b, h, 0))
    return per_head_call(_step_kernel, "wkv_step", "[B, H, N]", vec, (r, w, k, v, kk, a), S, interpret, layer)


def per_head_call(kernel, op: str, layout: str, row_spec: pl.BlockSpec, rows: tuple, S, interpret: bool,
                  layer: int | None = None):
    """Run a wkv ``kernel`` with one program per (batch, head): ``rows`` are r, w, k, v, kk, a
    (float32, all of the shape of r, described by ``layout`` in errors) read through
    ``row_spec``, S [B, H, N, N] (with `layer`: the whole leaf [B, L, H, N, N], L > layer) in a
    state dtype aliased to the new state -> (y float32 of r's shape, S' in S's dtype)."""
    shape = rows[0].shape
    for name, t in zip(("r", "w", "k", "v", "kk", "a"), rows):
        require(t.shape == shape and t.dtype == jnp.float32,
                f"{op}: {name} must be float32 {layout}={shape}, got {t.dtype} {t.shape}")
    B, H, N = shape[0], shape[-2], shape[-1]
    if layer is None:
        require(S.shape == (B, H, N, N) and is_state_dtype(S.dtype),
                f"{op}: S must be float32, bfloat16 or float16 [B, H, N, N], got {S.dtype} {S.shape}")
        mat = pl.BlockSpec((None, None, N, N), lambda b, h: (b, h, 0, 0))
    else:
        require(S.ndim == 5 and S.shape[0] == B and S.shape[2:] == (H, N, N) and 0 <= layer < S.shape[1]
                and is_state_dtype(S.dtype),
                f"{op}: S must be a float32, bfloat16 or float16 leaf [B, L, H, N, N] with L > layer={layer}, "
                f"got {S.dtype} {S.shape}")
        mat = pl.BlockSpec((None, None, None, N, N), lambda b, h: (b, layer, h, 0, 0))
    require(N & (N - 1) == 0, f"{op}: head size N={N} must be a power of two")
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct(S.shape, S.dtype)),
        grid=(B, H),
        in_specs=[row_spec] * 6 + [mat],
        out_specs=(row_spec, mat),
        input_output_aliases={6: 1},
        name=f"rwkv7_{op}",
        compiler_params=triton_params(num_warps=4, num_stages=1),
        interpret=interpret,
    )(*rows, S)
