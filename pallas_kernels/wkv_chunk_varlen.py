"""Chunked wkv7 prefill over a varlen stream: sequences flattened without padding (fla style,
``cu_seqlens``), each from its own state row, in one launch.

Flat tokens [T, H, N]; sequence p owns rows [cu_seqlens[p], cu_seqlens[p + 1]) and starts
from state row p. One program per (sequence, head, block of BV value rows) walks its
sequence in chunks of CHUNK tokens; the recurrence (``wkv_step``)
    S_t = S_{t-1} diag(w_t) + (S_{t-1} alpha_t) beta_t^T + v_t k_t^T,  y_t = S_t r_t
(alpha = -kk, beta = kk * a) is separable over value rows, and inside a chunk it is solved in
matrix form (the chunked generalized delta rule). With G_t = sum_{s<=t} log w_s per key channel:
    r~ = r e^{G},  a~ = alpha e^{G - log w},  b~ = beta e^{-G},  k~ = k e^{-G}       [L, N]
    SA = (I - tril_<(a~ b~^T))^{-1} (a~ S^T + tril_<(a~ k~^T) V)                [L, BV]
    Y  = r~ S^T + tril_<=(r~ b~^T) SA + tril_<=(r~ k~^T) V
    S' = S diag(e^{G_L}) + SA^T (beta e^{G_L - G}) + V^T (k e^{G_L - G})
where SA's rows are the S_{t-1} alpha_t of the recurrence; the unit lower-triangular inverse is
the product (I + M)(I + M^2)(I + M^4)... (M is nilpotent). e^{-G} grows like w^-CHUNK: RWKV-7's
decay w = exp(-exp(x)) with x <= -0.5 is >= 0.545, so it stays below 2e4 at CHUNK = 16.

CHUNK = 16 (bytes and FLOPs per token and head, N = 64): the bytes are 7 N float32 (1.8 kB)
at any chunk size; the multiply-adds are ~4 L N + L^2 log2 L on the key side (repeated per
value block) plus ~4 N BV + 4 L BV on the value side: ~25 k at L = 16, BV = 64, ~33 k at
L = 32, against 12 k for the per-token recurrence, which however runs T dependent steps where
this runs T / L. At 1.8 kB the H200 streams a token-head in ~0.4 ns, in which its tf32 tensor
cores (tf32x3: three passes, ~80 T multiply-adds/s) do ~30 k, so L = 16 stays just under the
balance point and L = 32 passes it; 16 is also Triton's smallest dot tile. Registers (ptxas, sm_90a,
1.5b varlen 4,096 tokens): 8 warps, BV = 32: 255 registers, no spill; BV = 64 spills 8 B, and
4 warps spill at BV = 32 (56 B) and 64 (904 B); with IEEE float32 products (no tensor cores)
every variant spills. So BV <= 32, 8 warps, tf32x3 products on the GPU (IEEE in interpret mode).

The state may be held in float32, bfloat16 or float16 (``common.STATE_DTYPES``): each
program reads its rows into float32, carries them through the whole sequence in registers and
rounds them back once at the end.

A chunk window that would run past the stream end is moved back to end there; its rows
outside [chunk start, sequence end) act as identity steps (w = 1, no update) and are not
stored. Rows past cu_seqlens[-1] (padding) come back zero; an empty sequence keeps its row.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from .common import is_state_dtype, require, triton_params
from .wkv_step import wkv_step_reference

CHUNK = 16              # tokens per chunk step (see the module doc)
TARGET_PROGRAMS = 264   # two per H200 SM: split the value rows until (P, H, N / BV) reaches it
MIN_VALUE_BLOCK = 16    # Triton's smallest dot tile
MAX_VALUE_BLOCK = 32    # value rows per program: 64 spills (ptxas, sm_90a, 8 warps)
NUM_WARPS = 8
GPU_PRECISION = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3  # fp32-accurate, on the tensor cores
_HIGHEST = jax.lax.Precision.HIGHEST


def wkv_varlen_reference(r, w, k, v, kk, a, S, cu_seqlens):
    """Naive per-token reference (jittable). r, w, k, v, kk, a: float32 [T, H, N] (flat tokens);
    S [P, H, N, N] in a state dtype (carried in float32); cu_seqlens int32 [P + 1],
    non-decreasing, cu_seqlens[0] = 0. Returns (y [T, H, N] float32, zero on rows past
    cu_seqlens[-1]; S' [P, H, N, N] in S's dtype)."""
    P, dtype = S.shape[0], S.dtype
    owner = jnp.searchsorted(cu_seqlens[1:], jnp.arange(r.shape[0]), side="right")

    def step(S, xs):
        p, x = xs
        row = jnp.minimum(p, P - 1)
        y, s = wkv_step_reference(*(o[None] for o in x), S[row][None])
        S = S.at[row].set(jnp.where(p < P, s[0], S[row]))
        return S, jnp.where(p < P, y[0], 0.0)

    S, y = jax.lax.scan(step, S.astype(jnp.float32), (owner, (r, w, k, v, kk, a)))
    return y, S.astype(dtype)


def _dot(x, y, contract: tuple[int, int], precision):
    return jax.lax.dot_general(x, y, (((contract[0],), (contract[1],)), ((), ())), precision=precision)


def chunk_step(S, r, w, k, v, kk, a, valid, precision=_HIGHEST):
    """One chunk of the recurrence in matrix form (module doc). S float32 [BV, N] (value rows,
    key columns); r, w, k, kk, a [L, N]; v [L, BV]; valid bool [L] (False rows are identity
    steps). L a power of two; `precision` that of every product (the kernel runs tf32x3 on the GPU).
    Returns (y [L, BV], S')."""
    L = r.shape[0]
    mm = functools.partial(_dot, contract=(1, 0), precision=precision)    # x @ y
    mm_t = functools.partial(_dot, contract=(1, 1), precision=precision)  # x @ y.T
    t_mm = functools.partial(_dot, contract=(0, 0), precision=precision)  # x.T @ y
    keep = valid[:, None]
    log_w = jnp.where(keep, jnp.log(w), 0.0)
    G = jnp.cumsum(log_w, axis=0)
    G_end = jnp.sum(log_w, axis=0)
    alpha = jnp.where(keep, -kk, 0.0)
    beta = -alpha * a
    k = jnp.where(keep, k, 0.0)
    v = jnp.where(keep, v, 0.0)
    grow = jnp.exp(-G)
    a_t, r_t, b_t, k_t = alpha * jnp.exp(G - log_w), r * jnp.exp(G), beta * grow, k * grow
    row = jax.lax.broadcasted_iota(jnp.int32, (L, L), 0)
    col = jax.lax.broadcasted_iota(jnp.int32, (L, L), 1)
    strict, incl = col < row, col <= row
    M = jnp.where(strict, mm_t(a_t, b_t), 0.0)
    sa = mm_t(a_t, S) + mm(jnp.where(strict, mm_t(a_t, k_t), 0.0), v)
    sa = sa + mm(M, sa)
    span = 2
    while span < L:  # (I - M)^-1 = (I + M)(I + M^2)(I + M^4)...
        M = mm(M, M)
        sa = sa + mm(M, sa)
        span *= 2
    y = (mm_t(r_t, S) + mm(jnp.where(incl, mm_t(r_t, b_t), 0.0), sa)
         + mm(jnp.where(incl, mm_t(r_t, k_t), 0.0), v))
    end = jnp.exp(G_end)
    S = S * end[None, :] + t_mm(sa, b_t * end[None, :]) + t_mm(v, k_t * end[None, :])
    return y, S


def _kernel(cu_ref, r_ref, w_ref, k_ref, v_ref, kk_ref, a_ref, s_ref, y0_ref, y_ref, s_out_ref, *, T: int,
            precision):
    del y0_ref  # aliased to y_ref: the zeros the padding rows keep
    p = pl.program_id(0)
    start, end = cu_ref[p], cu_ref[p + 1]
    offsets = jax.lax.broadcasted_iota(jnp.int32, (CHUNK,), 0)

    def body(c, S):
        first = start + c * CHUNK
        off = jnp.minimum(first, T - CHUNK)  # the window stays inside the stream
        rows = off + offsets
        valid = (rows >= first) & (rows < end)
        window = pl.ds(off, CHUNK)
        y, S = chunk_step(S, *(ref[window, :] for ref in (r_ref, w_ref, k_ref, v_ref, kk_ref, a_ref)),
                          valid, precision)
        plgpu_triton.store(y_ref.at[window, :], y, mask=jnp.broadcast_to(valid[:, None], y.shape))
        return S

    S = jax.lax.fori_loop(0, (end - start + CHUNK - 1) // CHUNK, body, s_ref[...].astype(jnp.float32))
    s_out_ref[...] = S.astype(s_out_ref.dtype)


def value_block(P: int, H: int, N: int) -> int:
    """Value rows per program: from min(N, MAX_VALUE_BLOCK), halved until P * H * (N / BV) >=
    TARGET_PROGRAMS (or BV = 16)."""
    bv = min(N, MAX_VALUE_BLOCK)
    while bv > MIN_VALUE_BLOCK and P * H * (N // bv) < TARGET_PROGRAMS:
        bv //= 2
    return bv


def wkv_chunk_varlen(r, w, k, v, kk, a, S, cu_seqlens, *, layer: int | None = None, interpret: bool = False):
    """Pallas kernel with the contract of `wkv_varlen_reference` (one launch); S (any state
    dtype) is aliased to S'.
    N must be a power of two >= 16. With `layer`, S is the whole [P, L, H, N, N] state leaf: its
    layer is read and written in place and the whole leaf comes back (no slice copied out)."""
    T, H, N = r.shape
    P = S.shape[0]
    if layer is not None:
        require(S.ndim == 5 and 0 <= layer < S.shape[1], f"wkv_chunk_varlen: S must be [P, L, H, N, N] with "
                f"layer < L, got {S.shape} and layer {layer}")
        leaf, S = S, S[:, layer]  # the slice only for the checks below: the kernel reads the leaf
    for name, t in (("r", r), ("w", w), ("k", k), ("v", v), ("kk", kk), ("a", a)):
        require(t.shape == (T, H, N) and t.dtype == jnp.float32,
                f"wkv_chunk_varlen: {name} must be float32 [T, H, N]={T, H, N}, got {t.dtype} {t.shape}")
    require(S.shape == (P, H, N, N) and is_state_dtype(S.dtype),
            f"wkv_chunk_varlen: S must be float32, bfloat16 or float16 [P, H, N, N]={P, H, N, N}, "
            f"got {S.dtype} {S.shape}")
    require(cu_seqlens.shape == (P + 1,) and cu_seqlens.dtype == jnp.int32,
            f"wkv_chunk_varlen: cu_seqlens must be int32 [P + 1]={P + 1,}, got {cu_seqlens.dtype} {cu_seqlens.shape}")
    require(N & (N - 1) == 0 and N >= MIN_VALUE_BLOCK,
            f"wkv_chunk_varlen: head size N={N} must be a power of two >= {MIN_VALUE_BLOCK}")
    operands = (r, w, k, v, kk, a)
    if T < CHUNK:  # the chunk window needs CHUNK rows to stand in
        operands = tuple(jnp.pad(o, ((0, CHUNK - T), (0, 0), (0, 0)), constant_values=1.0) for o in operands)
    Tp = max(T, CHUNK)
    bv = value_block(P, H, N)
    keys = pl.BlockSpec((Tp, None, N), lambda p, h, s: (0, h, 0))
    vals = pl.BlockSpec((Tp, None, bv), lambda p, h, s: (0, h, s))
    if layer is None:
        state = pl.BlockSpec((None, None, bv, N), lambda p, h, s: (p, h, s, 0))
    else:
        S = leaf
        state = pl.BlockSpec((None, None, None, bv, N), lambda p, h, s: (p, layer, h, s, 0))
    cu = pl.BlockSpec((P + 1,), lambda p, h, s: (0,))
    y, S = pl.pallas_call(
        functools.partial(_kernel, T=Tp, precision=_HIGHEST if interpret else GPU_PRECISION),
        out_shape=(jax.ShapeDtypeStruct((Tp, H, N), jnp.float32), jax.ShapeDtypeStruct(S.shape, S.dtype)),
        grid=(P, H, N // bv),
        in_specs=[cu, keys, keys, keys, vals, keys, keys, state, vals],
        out_specs=(vals, state),
        input_output_aliases={7: 1, 8: 0},
        name="rwkv7_wkv_chunk_varlen",
        compiler_params=triton_params(num_warps=NUM_WARPS, num_stages=1),
        interpret=interpret,
    )(cu_seqlens, *operands, S, jnp.zeros((Tp, H, N), jnp.float32))
    return y[:T], S
