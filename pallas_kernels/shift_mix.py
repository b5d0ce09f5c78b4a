"""Fused residual add + LayerNorm + token-shift mixes for T = 1 rows (one program per row),
beside the plain-jnp LayerNorm / mix pieces the whole model uses.

For each row b: h_out = h + delta; x = LayerNorm(h_out) (eps 1e-5, float32 statistics);
mixed[i] = x + (shift - x) * mix[i] for the n mixes (6 for time-mix in the order r, w, k,
v, a, g; 1 for channel-mix); x is the new token-shift state (written over `shift`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from rwkv7_core.constants import LN_EPS

from .common import next_pow2, require, triton_params
from .segment_linear import SplitSum, sum_splits


def layer_norm(x, weight, bias, eps: float = LN_EPS):
    """LayerNorm over the last axis with float32 statistics; result in x.dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    out = (xf - mean) * jax.lax.rsqrt(var + eps) * weight.astype(jnp.float32) + bias.astype(jnp.float32)
    return out.astype(x.dtype)


def add_layer_norm(h, delta, ln_w, ln_b):
    """(h_out, x): h_out = h + delta (h when delta is None), x = LayerNorm(h_out); any [..., C]."""
    h_out = h if delta is None else h + delta.astype(h.dtype)
    return h_out, layer_norm(h_out, ln_w, ln_b)


def token_mix(x, prev, mix):
    """The token-shift mixes x + (prev - x) * mix[i] for x, prev [..., C] and mix [n, C]:
    [n, ..., C] in x.dtype, computed in float32."""
    xf, pf = x.astype(jnp.float32), prev.astype(jnp.float32)
    m = mix.astype(jnp.float32).reshape((mix.shape[0],) + (1,) * (x.ndim - 1) + (mix.shape[1],))
    return (xf[None] + (pf - xf)[None] * m).astype(x.dtype)


def shift_mix_reference(h, delta, shift, ln_w, ln_b, mix):
    """Plain-jnp version (the model's XLA op). h, delta (or None), shift: [B, C]; ln_w, ln_b:
    [C]; mix: [n, C]. Returns (h_out [B, C], mixed [n, B, C], x_ln [B, C]) in h.dtype."""
    h_out, x = add_layer_norm(h, delta, ln_w, ln_b)
    return h_out, token_mix(x, shift, mix), x


def _kernel(*refs, n_mix: int, C: int, has_delta: bool):
    if has_delta:
        h_ref, d_ref, s_ref, lw_ref, lb_ref, mix_ref, h_out_ref, mixed_ref, x_ref = refs
    else:
        h_ref, s_ref, lw_ref, lb_ref, mix_ref, h_out_ref, mixed_ref, x_ref = refs
    # Blocks are C rounded up to a power of two; the Triton lowering does not bound-check
    # blocks, so every access past C is masked (the row's tail belongs to the next row).
    valid = jnp.arange(h_ref.shape[-1]) < C

    def load(ref):
        return plgpu_triton.load(ref, mask=valid, other=0).astype(jnp.float32)

    def store(ref, value):
        plgpu_triton.store(ref, value.astype(ref.dtype), mask=valid)

    dtype = h_out_ref.dtype
    h = plgpu_triton.load(h_ref, mask=valid, other=0)
    if has_delta and len(d_ref.shape) == 2:  # split-K partials [splits, C] of this row
        delta = sum_splits(lambda s: plgpu_triton.load(d_ref.at[s], mask=valid, other=0),
                           d_ref.shape[0], dtype)
        h = h + delta.astype(h.dtype)
    elif has_delta:
        h = h + plgpu_triton.load(d_ref, mask=valid, other=0).astype(h.dtype)
    store(h_out_ref, h)
    hf = h.astype(jnp.float32)
    mean = jnp.sum(hf) / C
    centred = jnp.where(valid, hf - mean, 0.0)
    var = jnp.sum(centred * centred) / C
    x = centred * jax.lax.rsqrt(var + LN_EPS) * load(lw_ref) + load(lb_ref)
    x = x.astype(dtype).astype(jnp.float32)
    diff = load(s_ref) - x
    store(x_ref, x)
    for i in range(n_mix):
        row = jnp.int32(i)  # an array index: interpret mode cannot discharge a plain int here
        store(mixed_ref.at[row], x + diff * load(mix_ref.at[row]))


def checked_operands(B: int, C: int, delta, ln_w, ln_b, mix):
    """shift_mix's delta as the kernels read it (None, [B, C], or a SplitSum's partials
    [splits, >= B, C]) once delta, ln_w, ln_b [C] and mix [n, C] are checked against B rows
    of width C (ValueError naming the operand otherwise); shared by every lowering."""
    if isinstance(delta, SplitSum):
        require(delta.M == B and delta.partials.shape[1] >= B and delta.partials.shape[2] == C,
                f"shift_mix: delta partials must be [splits, >= {B}, {C}], got {delta.partials.shape}")
        delta = delta.partials
    else:
        require(delta is None or delta.shape == (B, C),
                f"shift_mix: delta must be None, a SplitSum or [B, C]={B, C}, got {getattr(delta, 'shape', None)}")
    require(ln_w.shape == (C,) and ln_b.shape == (C,), "shift_mix: ln_w and ln_b must be [C]")
    require(mix.ndim == 2 and mix.shape[1] == C, f"shift_mix: mix must be [n, C], got {mix.shape}")
    return delta


def shift_mix(h, delta, shift, ln_w, ln_b, mix, *, layer: int | None = None, interpret: bool = False):
    """Pallas version of `shift_mix_reference`; the new shift state aliases `shift`. delta may
    be a SplitSum (the previous product's split-K partials, summed here: no reduction launch).

    Any C works (blocks are rounded up to a power of two and masked); n = mix.shape[0]. With
    `layer`, shift is the whole [B, L, C] state leaf: row (b, layer) is read and written in
    place and the returned shift is the whole leaf (nothing is sliced out).
    """
    B, C = h.shape
    n_mix = mix.shape[0]
    shift_shape = (B, C) if layer is None else (B, shift.shape[1], C)
    require(shift.shape == shift_shape, f"shift_mix: shift must be {shift_shape}, got {shift.shape}")
    require(layer is None or shift.dtype == h.dtype, "shift_mix: an in-place shift leaf must have h's dtype")
    partials = isinstance(delta, SplitSum)
    delta = checked_operands(B, C, delta, ln_w, ln_b, mix)
    Cp = next_pow2(C)
    row = pl.BlockSpec((None, Cp), lambda b: (b, 0))
    vec = pl.BlockSpec((Cp,), lambda b: (0,))
    mixes = pl.BlockSpec((n_mix, Cp), lambda b: (0, 0))
    state = row if layer is None else pl.BlockSpec((None, None, Cp), lambda b: (b, layer, 0))
    has_delta = delta is not None
    inputs = (h, delta, shift, ln_w, ln_b, mix) if has_delta else (h, shift, ln_w, ln_b, mix)
    delta_spec = pl.BlockSpec((delta.shape[0], None, Cp), lambda b: (0, b, 0)) if partials else row
    in_specs = [row, delta_spec, state, vec, vec, mixes] if has_delta else [row, state, vec, vec, mixes]
    shift_index = 2 if has_delta else 1
    dtype = h.dtype
    return pl.pallas_call(
        functools.partial(_kernel, n_mix=n_mix, C=C, has_delta=has_delta),
        out_shape=(jax.ShapeDtypeStruct((B, C), dtype),
                   jax.ShapeDtypeStruct((n_mix, B, C), dtype),
                   jax.ShapeDtypeStruct(shift_shape, dtype)),
        grid=(B,),
        in_specs=in_specs,
        out_specs=(row, pl.BlockSpec((n_mix, None, Cp), lambda b: (0, b, 0)), state),
        input_output_aliases={shift_index: 2} if shift.dtype == dtype else {},
        name="rwkv7_shift_mix",
        # 8 warps spilled 16-72 B (fp16 C = 2048 in place, bf16 C = 2560 with partials deltas)
        compiler_params=triton_params(num_warps=4 if Cp <= 1024 else 16),
        interpret=interpret,
    )(*inputs)
