"""The decode time-mix tail on Pallas Mosaic GPU: wkv operands, the wkv7 step on the whole state
in place, GroupNorm, bonus and gate (``pallas_kernels.wkv_tail``'s contract and reference,
``wkv_tail_reference``; the math from the same ``time_mix`` helpers).

One program (one warpgroup) per (row, head): TMA copies bring the head's slices of the split-K
partials, LoRA outputs, vectors, first-layer value and its [N, N] state block into shared
memory under one barrier; the state block goes back to the same place in the whole
[B, (L,) H, N, N] leaf (a ``jax.new_ref``, so the update is in place), the output row and the
first layer's value to their own arrays. Every copy is a whole [.., N] slice of a row, so no
read or write leaves its array (the interpreter raises if one did).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from ..common import require
from ..segment_linear import sum_splits
from ..time_mix import head_norm, in_context_rate, key_mix, log_decay, normalized_key, value_mix
from .common import interpret_params

F32 = jnp.float32
ROW = plgpu.Layout.WGMMA.reduce(1)  # a vector indexed by the state's rows (value side)
COL = plgpu.Layout.WGMMA.reduce(0)  # a vector indexed by the state's columns (key side)


def _body(*refs, first: bool, splits: int, H: int, layer: int | None, dtype):
    if first:
        (p_ref, l_ref, vec_ref, rk_ref, s_ref, o_ref, vfo_ref,
         p_sm, l_sm, vec_sm, rk_sm, s_sm, o_sm, vf_sm, bar) = refs
    else:
        (p_ref, l_ref, vec_ref, rk_ref, vf_ref, s_ref, o_ref,
         p_sm, l_sm, vec_sm, rk_sm, s_sm, o_sm, vf_sm, bar) = refs
    b, h = jax.lax.axis_index("b"), jax.lax.axis_index("h")
    N = s_sm.shape[-1]
    C = H * N
    cols = pl.ds(h * N, N)
    row = pl.ds(b, 1)
    state = s_ref.at[b, h] if layer is None else s_ref.at[b, layer, h]
    for seg in range(3):  # r, k, v products: columns [seg * C, (seg + 1) * C)
        plgpu.copy_gmem_to_smem(p_ref.at[:, b, pl.ds(seg * C + h * N, N)], p_sm.at[seg], bar)
    plgpu.copy_gmem_to_smem(l_ref.at[:, b, cols], l_sm, bar)
    plgpu.copy_gmem_to_smem(vec_ref.at[:, cols], vec_sm, bar)
    plgpu.copy_gmem_to_smem(rk_ref.at[pl.ds(h, 1)], rk_sm, bar)
    if not first:
        plgpu.copy_gmem_to_smem(vf_ref.at[row, cols], vf_sm, bar)
    plgpu.copy_gmem_to_smem(state, s_sm, bar)
    plgpu.barrier_wait(bar)

    # The [N, N] state in the WGMMA register layout (N = 64 rows: one warpgroup tile); a vector
    # over its columns (key side: r, w, k, kk, a) in that layout reduced over rows, a vector over
    # its rows (value side: v, the output) reduced over columns. Broadcasts go straight to
    # [N, N] (no [1, N] intermediate, which has no warpgroup layout).
    col = lambda ref: plgpu.load(ref, layout=COL, optimized=False)  # noqa: E731
    row_ = lambda ref: plgpu.load(ref, layout=ROW, optimized=False)  # noqa: E731
    over_cols = lambda x: jax.lax.broadcast_in_dim(x, (N, N), (1,))  # noqa: E731
    over_rows = lambda x: jax.lax.broadcast_in_dim(x, (N, N), (0,))  # noqa: E731
    r, k = (sum_splits(lambda s, seg=seg: col(p_sm.at[seg, s]), splits, dtype) for seg in range(2))
    v = sum_splits(lambda s: row_(p_sm.at[2, s]), splits, dtype)
    w = jnp.exp(log_decay(col(vec_sm.at[0]), col(l_sm.at[0]).astype(F32)))
    a = in_context_rate(col(vec_sm.at[1]), col(l_sm.at[1]).astype(F32))
    g = row_(l_sm.at[3 - first]).astype(F32)
    kk = normalized_key(k, col(vec_sm.at[3]))
    k = key_mix(k, a, col(vec_sm.at[4]))
    if first:
        vf_sm[0] = v
    else:
        v = value_mix(v, row_(vf_sm.at[0]), row_(vec_sm.at[2]), row_(l_sm.at[2]).astype(F32))
    S = plgpu.load(s_sm, layout=plgpu.Layout.WGMMA, optimized=False)
    sa = jnp.sum(S * over_cols(-kk), axis=1)
    S = S * over_cols(w) + over_rows(sa) * over_cols(kk * a) + over_rows(v) * over_cols(k)
    s_sm[...] = S
    y = head_norm(jnp.sum(S * over_cols(r), axis=1)) * row_(vec_sm.at[5]) + row_(vec_sm.at[6])
    y = y + jnp.sum(r * k * col(rk_sm.at[0])) * v  # time_mix.bonus, its sum a scalar here
    o_sm[0] = (y * g).astype(o_sm.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(s_sm, state)
    plgpu.copy_smem_to_gmem(o_sm, o_ref.at[row, cols])
    if first:
        plgpu.copy_smem_to_gmem(vf_sm, vfo_ref.at[row, cols])
    plgpu.wait_smem_to_gmem(0)


def supports(N: int) -> bool:
    """Whether the kernel serves head size N: the state must tile the WGMMA layout (N % 64 == 0)."""
    return N % 64 == 0


def wkv_tail(partials, lora, vecs, r_k, v_first, S, *, layer: int | None = None, interpret: bool = False):
    """Mosaic GPU version of ``pallas_kernels.wkv_tail.wkv_tail`` (same arguments and results).

    partials float32 [splits, Mp, >= 3C]; lora [n, Mp, C] (model dtype; n = 3 on the first layer
    (v_first None), else 4); vecs [7, C], r_k [H, N] float32; v_first [M, C] float32 | None; S
    float32 [B, H, N, N], or [B, L, H, N, N] with `layer`; M = B rows. Returns (out [M, C] model
    dtype, S' (S updated in place when donated), v_first [M, C] float32). interpret: GPU
    interpret mode with race detection (``common.interpret_params``)."""
    splits, Mp, _ = partials.shape
    n, _, C = lora.shape
    H, N = r_k.shape
    first = v_first is None
    M = S.shape[0]
    dtype = lora.dtype
    require(n == (3 if first else 4), f"wkv_tail: {n} LoRA outputs, expected {3 if first else 4}")
    require(C == H * N and vecs.shape == (7, C), f"wkv_tail: vecs must be [7, {C}], r_k [H, N]")
    state_shape = (M, H, N, N) if layer is None else (M, S.shape[1], H, N, N)
    require(supports(N), f"wkv_tail (Mosaic): head size N={N} must be a multiple of 64")
    require(S.shape == state_shape and S.dtype == F32 and M <= Mp,
            f"wkv_tail: S must be float32 {state_shape}, got {S.dtype} {S.shape}")
    copies = 7 + (not first)
    scratch = (plgpu.SMEM((3, splits, N), F32), plgpu.SMEM((n, N), dtype), plgpu.SMEM((7, N), F32),
               plgpu.SMEM((1, N), F32), plgpu.SMEM((N, N), F32), plgpu.SMEM((1, N), dtype),
               plgpu.SMEM((1, N), F32), plgpu.Barrier(num_arrivals=copies))
    out_type = [jax.ShapeDtypeStruct((M, C), dtype)] + ([jax.ShapeDtypeStruct((M, C), F32)] if first else [])
    kernel = plgpu.kernel(
        functools.partial(_body, first=first, splits=splits, H=H, layer=layer, dtype=jnp.dtype(dtype)),
        out_type=tuple(out_type), grid=(M, H), grid_names=("b", "h"), scratch_types=scratch,
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret_params(interpret), kernel_name="rwkv7_mosaic_wkv_tail")
    state = jax.new_ref(S, memory_space=plgpu.GMEM)
    inputs = (partials, lora, vecs, r_k) + (() if first else (v_first,))
    outs = kernel(*inputs, state)
    return outs[0], jax.freeze(state), (outs[1] if first else v_first)
