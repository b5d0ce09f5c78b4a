"""Fused residual add + LayerNorm + token shift + mixes over a token stream of many sequences
(prefill: dense or varlen rows), one launch in place of XLA's add, LayerNorm, shift gather and
one fusion per mix.

Rows [M, C] are flat tokens; ``links`` int32 [2, M] says, per row t, where its predecessor is
and whether it ends a sequence (built once per call by ``row_links``):
    links[0, t] = t - 1 if t continues a sequence, else -1 - p (its sequence p starts here:
                  the predecessor is shift[p], the carried token-shift state)
    links[1, t] = p if t is the last token of sequence p, else -1
One program per row: h_out = h + delta; x = LayerNorm(h_out); prev = LayerNorm(h_out[t - 1])
(recomputed from the neighbour row: no second pass) or shift[p]; mixed[i] = x + (prev - x) *
mix[i], each mix its own [M, C] output (a GEMM reads it whole, no slice copy); x of a last
row goes to new_shift[p] (rows of empty sequences are not written: callers keep the old row).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu_triton

from rwkv7_core.constants import LN_EPS

from .common import next_pow2, require, triton_params
from .shift_mix import add_layer_norm, token_mix


def row_links(cu_seqlens, n_rows: int):
    """links int32 [2, n_rows] (module doc) for sequences [cu[p], cu[p + 1]); rows past
    cu[-1] (padding) continue the stream (their outputs are never read)."""
    t = jnp.arange(n_rows, dtype=jnp.int32)
    P = cu_seqlens.shape[0] - 1
    # compare_all: one fusion of T x P compares; the default scan is a device while loop
    owner = jnp.searchsorted(cu_seqlens[1:], t, side="right", method="compare_all").astype(jnp.int32)  # P: padding
    o = jnp.minimum(owner, P - 1)
    start = (owner < P) & (t == cu_seqlens[o])
    last = (owner < P) & (t == cu_seqlens[o + 1] - 1)
    return jnp.stack([jnp.where(start, -1 - o, jnp.maximum(t - 1, 0)), jnp.where(last, o, -1)])


class MixRows(tuple):
    """The n mixes as separate [M, C] arrays, indexable like a stacked [n, M, C] array."""

    @property
    def shape(self) -> tuple:
        return (len(self),) + self[0].shape

    @property
    def dtype(self):
        return self[0].dtype


jax.tree_util.register_pytree_node(MixRows, lambda m: (tuple(m), None), lambda _, rows: MixRows(rows))


def shift_mix_rows_reference(h, delta, shift, ln_w, ln_b, mix, links):
    """Plain jnp: h, delta (or None) [M, C], shift [P, C], ln_w, ln_b [C], mix [n, C], links
    int32 [2, M] -> (h_out [M, C], MixRows of n [M, C], new_shift [P, C]) in h.dtype; rows of
    sequences without a last row (empty) keep shift."""
    h_out, x = add_layer_norm(h, delta, ln_w, ln_b)
    pred, last = links[0], links[1]
    P = shift.shape[0]
    prev = jnp.where((pred < 0)[:, None], shift.astype(x.dtype)[jnp.clip(-1 - pred, 0, P - 1)],
                     x[jnp.maximum(pred, 0)])
    mixed = token_mix(x, prev, mix)
    new_shift = shift.astype(x.dtype).at[jnp.where(last >= 0, last, P)].set(x, mode="drop")
    return h_out, MixRows(mixed[i] for i in range(mix.shape[0])), new_shift


def _kernel(*refs, n_mix: int, C: int, has_delta: bool, layer: int):
    if has_delta:
        links_ref, h_ref, d_ref, s_ref, lw_ref, lb_ref, mix_ref, *outs = refs
    else:
        links_ref, h_ref, s_ref, lw_ref, lb_ref, mix_ref, *outs = refs
        d_ref = None
    h_out_ref, shift_out_ref, *mixed_refs = outs
    t = pl.program_id(0)
    valid = jnp.arange(h_ref.shape[-1]) < C
    dtype = h_out_ref.dtype

    def load(ref, row=None):
        ref = ref if row is None else ref.at[row]
        return plgpu_triton.load(ref, mask=valid, other=0).astype(jnp.float32)

    def residual(row):
        h = plgpu_triton.load(h_ref.at[row], mask=valid, other=0)
        if d_ref is not None:
            h = h + plgpu_triton.load(d_ref.at[row], mask=valid, other=0).astype(h.dtype)
        return h

    def norm(h):
        hf = h.astype(jnp.float32)
        mean = jnp.sum(hf) / C
        centred = jnp.where(valid, hf - mean, 0.0)
        var = jnp.sum(centred * centred) / C
        x = centred * jax.lax.rsqrt(var + LN_EPS) * load(lw_ref) + load(lb_ref)
        return x.astype(dtype).astype(jnp.float32)

    pred, last = links_ref[0, t], links_ref[1, t]
    h = residual(t)
    plgpu_triton.store(h_out_ref.at[t], h.astype(dtype), mask=valid)
    x = norm(h)
    carried = load(s_ref.at[jnp.maximum(-1 - pred, 0), jnp.int32(layer)])
    prev = jnp.where(pred >= 0, norm(residual(jnp.maximum(pred, 0))), carried)
    diff = prev - x
    for i in range(n_mix):
        row = jnp.int32(i)  # an array index: interpret mode cannot discharge a plain int here
        plgpu_triton.store(mixed_refs[i].at[t], (x + diff * load(mix_ref, row)).astype(dtype), mask=valid)
    plgpu_triton.store(shift_out_ref.at[jnp.maximum(last, 0)], x.astype(dtype), mask=valid & (last >= 0))


def shift_mix_rows(h, delta, shift, ln_w, ln_b, mix, links, *, layer: int | None = None,
                   interpret: bool = False):
    """Pallas version of `shift_mix_rows_reference` (one launch, one program per row). Any C.
    With `layer`, shift is the whole [P, L, C] state leaf and its row (p, layer) is read in
    place (no slice of it is copied out); new_shift is [P, C] either way."""
    M, C = h.shape
    P, n_mix = shift.shape[0], mix.shape[0]
    if layer is None:
        shift, layer = shift[:, None], 0
    require(shift.ndim == 3 and shift.shape[2] == C and 0 <= layer < shift.shape[1],
            f"shift_mix_rows: shift must be [P, {C}] or [P, L, {C}] with layer < L, got {shift.shape}")
    require(delta is None or delta.shape == (M, C),
            f"shift_mix_rows: delta must be None or [M, C]={M, C}, got {getattr(delta, 'shape', None)}")
    require(ln_w.shape == (C,) and ln_b.shape == (C,), "shift_mix_rows: ln_w and ln_b must be [C]")
    require(mix.ndim == 2 and mix.shape[1] == C, f"shift_mix_rows: mix must be [n, C], got {mix.shape}")
    require(links.shape == (2, M) and links.dtype == jnp.int32, f"shift_mix_rows: links must be int32 [2, {M}]")
    Cp = next_pow2(C)
    rows = pl.BlockSpec((M, Cp), lambda t: (0, 0))  # whole arrays: a row and its neighbour are read
    vec = pl.BlockSpec((Cp,), lambda t: (0,))
    has_delta = delta is not None
    dtype = h.dtype
    inputs = (links, h) + ((delta,) if has_delta else ()) + (shift.astype(dtype), ln_w, ln_b, mix)
    in_specs = ([pl.BlockSpec((2, M), lambda t: (0, 0)), rows] + ([rows] if has_delta else [])
                + [pl.BlockSpec((P, shift.shape[1], Cp), lambda t: (0, 0, 0)), vec, vec,
                   pl.BlockSpec((n_mix, Cp), lambda t: (0, 0))])
    h_out, new_shift, *mixed = pl.pallas_call(
        functools.partial(_kernel, n_mix=n_mix, C=C, has_delta=has_delta, layer=layer),
        out_shape=[jax.ShapeDtypeStruct((M, C), dtype), jax.ShapeDtypeStruct((P, C), dtype)]
        + [jax.ShapeDtypeStruct((M, C), dtype)] * n_mix,
        grid=(M,),
        in_specs=in_specs,
        out_specs=[rows, pl.BlockSpec((P, Cp), lambda t: (0, 0))] + [rows] * n_mix,
        name="rwkv7_shift_mix_rows",
        compiler_params=triton_params(num_warps=4 if Cp <= 1024 else 16),
        interpret=interpret,
    )(*inputs)
    # rows of sequences with no last row were never written: keep their carried state
    written = jnp.zeros((P + 1,), bool).at[jnp.where(links[1] >= 0, links[1], P)].set(True)[:P]
    return h_out, MixRows(mixed), jnp.where(written[:, None], new_shift, shift[:, layer].astype(dtype))


def dense_links(B: int, T: int) -> np.ndarray:
    """links for B sequences of T tokens each (row b*T + t), as a numpy constant."""
    t = np.arange(B * T)
    pred = np.where(t % T == 0, -1 - t // T, t - 1)
    last = np.where(t % T == T - 1, t // T, -1)
    return np.stack([pred, last]).astype(np.int32)
