"""Residual add + LayerNorm + token-shift mixes for T = 1 rows on Pallas Mosaic GPU
(``pallas_kernels.shift_mix``'s contract and reference, ``shift_mix_reference``).

One program (one warpgroup) per row: TMA copies bring the row of h, its delta (a [B, C] row or
the previous product's split-K partials: in groups of splits that fit ``PARTIALS_SMEM``, summed
in split order, each group copied once the previous one is read), its token-shift row, the
LayerNorm vectors and the mixes into shared memory; the results go back by TMA, the new shift row to the
same place in the whole state leaf (a ``jax.new_ref``: updated in place). A warpgroup vector
must hold a multiple of 128 elements, so every row lives in shared memory padded to
Cp = C rounded up to 128 (C = 192 -> 256): the buffers are zeroed before the copies land in
their first C elements (in copies of at most 256 elements: TMA's box), the padding adds zero to the sums and the LayerNorm variance subtracts
its (Cp - C) centred terms exactly; only the first C elements are copied out, so no read or
write leaves its array.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rwkv7_core.constants import LN_EPS

from ..common import require
from ..segment_linear import SplitSum
from ..shift_mix import checked_operands
from .common import interpret_params, pieces, tma_ok

F32 = jnp.float32
LANES = 128  # a warpgroup vector holds a multiple of this many elements
PARTIALS_SMEM = 64 * 1024  # shared memory for a delta's split-K partials (more splits: in groups)


def padded(C: int) -> int:
    """C rounded up to a whole number of warpgroup vectors."""
    return -(-C // LANES) * LANES


def supports(C: int, itemsizes) -> bool:
    """Whether every TMA copy of a C-element row (pieces of at most 256) in arrays of these
    item sizes moves a whole multiple of 128 bytes (``common.tma_ok``)."""
    return all(tma_ok(cols.size, item) for cols in pieces(C) for item in itemsizes)


def split_group(splits: int, Cp: int) -> int:
    """Splits of the partials held in shared memory at once: the largest divisor of `splits`
    whose float32 rows fit PARTIALS_SMEM (at least 1)."""
    return max(g for g in range(1, splits + 1) if splits % g == 0 and (g == 1 or g * Cp * 4 <= PARTIALS_SMEM))


def _body(*refs, n_mix: int, C: int, delta_kind: str, layer: int | None):
    d_bar = None
    if delta_kind == "none":
        h_ref, lw_ref, lb_ref, mix_ref, s_ref, h_out_ref, mixed_ref, h_sm, v_sm, mix_sm, s_sm, o_sm, bar = refs
        d_ref = d_sm = None
    elif delta_kind == "rows":
        (h_ref, d_ref, lw_ref, lb_ref, mix_ref, s_ref, h_out_ref, mixed_ref,
         h_sm, d_sm, v_sm, mix_sm, s_sm, o_sm, bar) = refs
    else:
        (h_ref, d_ref, lw_ref, lb_ref, mix_ref, s_ref, h_out_ref, mixed_ref,
         h_sm, d_sm, v_sm, mix_sm, s_sm, o_sm, bar, d_bar) = refs
    b = jax.lax.axis_index("b")
    shift = s_ref.at[b] if layer is None else s_ref.at[b, layer]
    dtype = h_out_ref.dtype
    # Zero the padding (the whole buffers: a C-element tail is not a warpgroup vector), then
    # order those generic-proxy writes before the TMA copies land.
    for buf in (h_sm, d_sm, v_sm, mix_sm, s_sm):
        if buf is not None and buf.shape[-1] != C:
            buf[...] = jnp.zeros(buf.shape, buf.dtype)
    plgpu.commit_smem()

    def copy_splits(g: int):
        """The partials of split group g into d_sm (one split a copy: shared memory pieces
        are contiguous), on barrier g."""
        group = d_sm.shape[0]
        for s in range(g * group, (g + 1) * group):
            for cols in pieces(C):
                plgpu.copy_gmem_to_smem(d_ref.at[s, b, cols], d_sm.at[s - g * group, cols], d_bar.at[g])

    if delta_kind == "partials":
        copy_splits(0)
    for cols in pieces(C):  # TMA copies of at most TMA_BOX elements a row
        plgpu.copy_gmem_to_smem(h_ref.at[pl.ds(b, 1), cols], h_sm.at[:, cols], bar)
        if delta_kind == "rows":
            plgpu.copy_gmem_to_smem(d_ref.at[pl.ds(b, 1), cols], d_sm.at[:, cols], bar)
        plgpu.copy_gmem_to_smem(lw_ref.at[cols], v_sm.at[0, cols], bar)
        plgpu.copy_gmem_to_smem(lb_ref.at[cols], v_sm.at[1, cols], bar)
        for i in range(n_mix):
            plgpu.copy_gmem_to_smem(mix_ref.at[i, cols], mix_sm.at[i, cols], bar)
        plgpu.copy_gmem_to_smem(shift.at[cols], s_sm.at[0, cols], bar)
    plgpu.barrier_wait(bar)

    # One strided layout for every row, whatever its dtype (the default one differs per
    # dtype: bfloat16 and float32 rows would not combine).
    Cp = h_sm.shape[-1]
    layout = plgpu.Layout.WG_STRIDED((Cp,), vec_size=2 if Cp % (2 * LANES) == 0 else 1)

    def row(ref):
        return plgpu.load(ref, layout=layout, optimized=False)

    h = row(h_sm.at[0])
    if delta_kind == "partials":  # summed in split order, group by group through d_sm
        total = None
        for g in range(d_ref.shape[0] // d_sm.shape[0]):
            if g:
                plgpu.commit_smem()  # the previous group's reads before these copies overwrite d_sm
                copy_splits(g)
            plgpu.barrier_wait(d_bar.at[g])
            for j in range(d_sm.shape[0]):
                split = row(d_sm.at[j])
                total = split if total is None else total + split
        h = h + total.astype(dtype)  # rounded as sum_splits rounds the reference's product
    elif delta_kind == "rows":
        h = h + row(d_sm.at[0]).astype(dtype)
    o_sm[0] = h
    hf = h.astype(F32)
    mean = jnp.sum(hf) / C
    centred = hf - mean
    pad = Cp - C  # padded elements hold 0: their centred square is mean^2 each
    var = (jnp.sum(centred * centred) - pad * mean * mean) / C
    x = centred * jax.lax.rsqrt(var + LN_EPS) * row(v_sm.at[0]).astype(F32) + row(v_sm.at[1]).astype(F32)
    x = x.astype(dtype)
    diff = row(s_sm.at[0]).astype(F32) - x.astype(F32)
    s_sm[0] = x
    for i in range(n_mix):
        o_sm[1 + i] = (x.astype(F32) + diff * row(mix_sm.at[i]).astype(F32)).astype(dtype)
    plgpu.commit_smem()
    for cols in pieces(C):
        plgpu.copy_smem_to_gmem(o_sm.at[pl.ds(0, 1), cols], h_out_ref.at[pl.ds(b, 1), cols])
        for i in range(n_mix):
            plgpu.copy_smem_to_gmem(o_sm.at[1 + i, cols], mixed_ref.at[i, b, cols])
        plgpu.copy_smem_to_gmem(s_sm.at[0, cols], shift.at[cols])
    plgpu.wait_smem_to_gmem(0)


def shift_mix(h, delta, shift, ln_w, ln_b, mix, *, layer: int | None = None, interpret: bool = False):
    """Mosaic GPU version of ``pallas_kernels.shift_mix.shift_mix`` (same arguments and results):
    h [B, C], delta None | [B, C] | SplitSum (partials [splits, >= B, C]), shift [B, C] (or the
    whole [B, L, C] leaf with `layer`, h's dtype), ln_w, ln_b [C], mix [n, C] -> (h_out [B, C],
    mixed [n, B, C], shift') in h.dtype; shift' is the shift updated in place (its row, or row
    (b, layer) of the leaf, now the LayerNorm output). interpret: GPU interpret mode with race
    detection (``common.interpret_params``)."""
    B, C = h.shape
    n_mix = mix.shape[0]
    dtype = h.dtype
    shift_shape = (B, C) if layer is None else (B, shift.shape[1], C)
    require(shift.shape == shift_shape and shift.dtype == dtype,
            f"shift_mix (Mosaic): shift must be {dtype} {shift_shape}, got {shift.dtype} {shift.shape}")
    partials = isinstance(delta, SplitSum)
    delta = checked_operands(B, C, delta, ln_w, ln_b, mix)
    require(ln_w.dtype == ln_b.dtype, "shift_mix: ln_w and ln_b must share a dtype")
    itemsizes = {x.dtype.itemsize for x in (h, ln_w, mix) + (() if delta is None else (delta,))}
    require(supports(C, itemsizes), f"shift_mix (Mosaic): a row of C={C} makes a TMA copy of a partial 128 bytes")
    Cp = padded(C)
    delta_kind = "none" if delta is None else ("partials" if partials else "rows")
    scratch = [plgpu.SMEM((1, Cp), dtype)]
    group = split_group(delta.shape[0], Cp) if partials else 1
    if delta is not None:
        scratch.append(plgpu.SMEM((group, Cp), delta.dtype))
    rows_delta = delta is not None and not partials
    scratch += [plgpu.SMEM((2, Cp), ln_w.dtype), plgpu.SMEM((n_mix, Cp), mix.dtype), plgpu.SMEM((1, Cp), dtype),
                plgpu.SMEM((1 + n_mix, Cp), dtype), plgpu.Barrier(num_arrivals=(4 + n_mix + rows_delta) * len(pieces(C)))]
    if partials:
        scratch.append(plgpu.Barrier(num_arrivals=group * len(pieces(C)), num_barriers=delta.shape[0] // group))
    kernel = plgpu.kernel(
        functools.partial(_body, n_mix=n_mix, C=C, delta_kind=delta_kind, layer=layer),
        out_type=(jax.ShapeDtypeStruct((B, C), dtype), jax.ShapeDtypeStruct((n_mix, B, C), dtype)),
        grid=(B,), grid_names=("b",), scratch_types=tuple(scratch),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
        interpret=interpret_params(interpret), kernel_name="rwkv7_mosaic_shift_mix")
    state = jax.new_ref(shift, memory_space=plgpu.GMEM)
    inputs = (h,) + (() if delta is None else (delta,)) + (ln_w, ln_b, mix)
    h_out, mixed = kernel(*inputs, state)
    return h_out, mixed, jax.freeze(state)
