"""wkv7 sequence kernel for prefill (T > 1): one Pallas program per (sequence, head).

Each program keeps its [N, N] float32 state in registers and walks the T steps in chunks of
CHUNK statically unrolled steps (the loads of a chunk do not depend on the state, so they are
issued ahead of the serial state updates); a tail of T % CHUNK single steps follows. The state
comes in and goes out (aliased) in its state dtype, rounded once at the end. Step math as in
`wkv_step`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .wkv_step import per_head_call, wkv_step_reference

CHUNK = 8  # time steps per unrolled chunk


def wkv_seq_reference(r, w, k, v, kk, a, S):
    """Plain-jnp recurrence over T. r, w, k, v, kk, a: [B, T, H, N] float32; S [B, H, N, N] in a
    state dtype, carried in float32 through the T steps.

    Returns (y [B, T, H, N] float32, S_final [B, H, N, N] in S's dtype).
    """
    def step(S, xs):
        y, S = wkv_step_reference(*xs, S)
        return S, y

    dtype = S.dtype
    S, ys = jax.lax.scan(step, S.astype(jnp.float32), tuple(jnp.moveaxis(t, 1, 0) for t in (r, w, k, v, kk, a)))
    return jnp.moveaxis(ys, 0, 1), S.astype(dtype)


def _seq_kernel(r_ref, w_ref, k_ref, v_ref, kk_ref, a_ref, s_ref, y_ref, s_out_ref, *, T: int):
    def one_step(t, S):
        kk = kk_ref[t, :]
        sa = jnp.sum(S * (-kk)[None, :], axis=1)
        S = (S * w_ref[t, :][None, :] + sa[:, None] * (kk * a_ref[t, :])[None, :]
             + v_ref[t, :][:, None] * k_ref[t, :][None, :])
        y_ref[t, :] = jnp.sum(S * r_ref[t, :][None, :], axis=1)
        return S

    def chunk(c, S):
        t0 = c * CHUNK
        for i in range(CHUNK):
            S = one_step(t0 + i, S)
        return S

    n_chunks = T // CHUNK
    S = jax.lax.fori_loop(0, n_chunks, chunk, s_ref[...].astype(jnp.float32))
    S = jax.lax.fori_loop(n_chunks * CHUNK, T, one_step, S)
    s_out_ref[...] = S.astype(s_out_ref.dtype)


def wkv_seq(r, w, k, v, kk, a, S, *, interpret: bool = False):
    """Pallas recurrence with the contract of `wkv_seq_reference`; S is aliased to S_final."""
    B, T, H, N = r.shape
    seq = pl.BlockSpec((None, T, None, N), lambda b, h: (b, 0, h, 0))
    return per_head_call(functools.partial(_seq_kernel, T=T), "wkv_seq", "[B, T, H, N]", seq,
                         (r, w, k, v, kk, a), S, interpret)
