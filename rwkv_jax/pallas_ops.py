"""The Pallas implementation of the kernel-op contract (see rwkv_jax/ops.py), per path.

- B1T1 (one row): wkv step kernel, fused add+LayerNorm+shift mixes, M = 1 split-K
  matrix-vector products, sparse channel-mix (skips the value rows of zero activations).
  The state is ``InPlaceState`` (the mixes and the wkv step read and write their layer of
  the whole [B, L, ...] leaves: no per-layer slice copies).
- BATCHED_DECODE (B rows, T = 1): as B1T1, with small-M split-K products while
  rows <= small_m_linear.MAX_M (an XLA dot above), sparse channel-mix while rows <=
  SPARSE_MAX_ROWS (the union of active units grows with the rows, so the saving fades).
- DENSE (T > 1, or very large B): the chunked wkv kernel for T > wkv_chunk_varlen.CHUNK (T / 16
  dependent chunk steps instead of T token steps, the same bytes), the per-token sequence kernel
  below; the varlen stream (``FlatRows``) always takes the chunked kernel (one launch instead of
  a loop of per-token steps); the residual add + LayerNorm + token shift + mixes are one launch
  (``shift_mix_rows``: the mixes as separate arrays, no slice copies); the wkv operands from the
  time-mix products (``wkv_operands``) and GroupNorm + bonus + gate after the recurrence
  (``wkv_output``) are one launch each; matrix products and the channel-mix stay XLA
  (compute-bound GEMMs XLA already does well); the state is ``RowsState``
  (the wkv leaf updated in place by the chunked kernel, the shift rows read from the whole
  leaves: no per-layer slice copies or updates).
Quantized weights (``pallas_kernels.quantized.QuantizedWeight``) take the quantized variants:
``quantized_linear`` for the products, ``quantized_channel_mix`` (its value product skipping
the columns of zero units) and, in ``fused_ops``, the same launches with quantized tiles.
Shapes a kernel cannot serve (e.g. low-rank widths without a power-of-two divisor >= 16)
fall back to the XLA op, decided at trace time from static shapes.

``fused_ops`` (``kernels="pallas-fused"``) is the fewer-launch decode variant (B1T1 and
BATCHED_DECODE; DENSE is as above): the state in place as above, and the time-mix runs as
four launches (``pallas_kernels.fused_time_mix``) instead of eleven products,
their reductions and the elementwise fusions between them.
"""
from __future__ import annotations

import functools

import jax.numpy as jnp

from pallas_kernels import fused_time_mix as fused_time_mix_kernel
from pallas_kernels import quantized_channel_mix as quantized_mix_kernel
from pallas_kernels import quantized_linear as quantized_kernel
from pallas_kernels import shift_mix as shift_mix_kernel
from pallas_kernels import shift_mix_rows as shift_mix_rows_kernel
from pallas_kernels import small_m_linear as linear_kernel
from pallas_kernels import sparse_channel_mix as sparse_kernel
from pallas_kernels import wkv_chunk_varlen as chunk_kernel
from pallas_kernels import wkv_operands as operands_kernel
from pallas_kernels import wkv_output as output_kernel
from pallas_kernels import wkv_seq as wkv_seq_kernel
from pallas_kernels import wkv_step as wkv_step_kernel
from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.time_mix import time_mix_reference, wkv_operands_reference, wkv_output_reference

from .ops import XLA_OPS, Ops
from .paths import Path
from .state_views import InPlaceState, LayerSlice, RowsState
from .varlen import Segments, cu_seqlens

# Rows up to which the sparse channel-mix is used on the decode paths. A guess until
# measured: `benchmarks/gpu_check.py` times sparse vs dense channel-mix per row count on the
# GPU; set this to the largest row count where sparse still wins.
SPARSE_MAX_ROWS = 4


def linear(x, w, *, max_rows: int, interpret: bool):
    """Small-M split-K product when x has <= max_rows rows and K suits the kernel, else XLA."""
    M, K = x.shape
    if isinstance(w, QuantizedWeight):
        if M <= max_rows and quantized_kernel.supports(M, w):
            return quantized_kernel.quantized_linear(x, w, interpret=interpret)
    elif M <= max_rows and linear_kernel.supports(M, w.shape[0], K):
        return linear_kernel.small_m_linear(x, w, interpret=interpret)
    return XLA_OPS.linear(x, w)


def channel_mix(xk, w_key, w_val_t, *, max_rows: int, interpret: bool):
    """Contract channel_mix (w_val_t [F, C]): the split-K key product and the row-walking value
    product for up to max_rows rows, skipping zero activations while rows <= SPARSE_MAX_ROWS
    (beyond that it walks every unit: a dense split-K product); XLA otherwise."""
    M, C = xk.shape
    F = w_key.shape[0]
    if isinstance(w_key, QuantizedWeight):
        if M <= max_rows and quantized_mix_kernel.supports(M, w_key, w_val_t):
            return quantized_mix_kernel.quantized_channel_mix(xk, w_key, w_val_t, skip=M <= SPARSE_MAX_ROWS,
                                                              interpret=interpret)
    elif M <= max_rows and linear_kernel.supports(M, F, C) and sparse_kernel.supports(M, F, C):
        return sparse_kernel.sparse_channel_mix(xk, w_key, w_val_t, skip=M <= SPARSE_MAX_ROWS,
                                                interpret=interpret)
    return XLA_OPS.channel_mix(xk, w_key, w_val_t)


def _leaf(S):
    """(whole leaf, layer) of a LayerSlice state (``RowsState``); (S, None) for plain rows."""
    return (S.full, S.layer) if isinstance(S, LayerSlice) else (S, None)


def _like(S, new):
    """The kernel's state result in the form S came in (a LayerSlice keeps its layer)."""
    return LayerSlice(new, S.layer) if isinstance(S, LayerSlice) else new


def wkv_varlen(r, w, k, v, kk, a, S, segs: Segments, *, n_single: int = 0, interpret: bool):
    """Contract wkv_varlen by the chunked kernel (length-1 sequences need no special case); on
    a LayerSlice state (``RowsState``) the layer of the whole leaf is updated in place."""
    del n_single
    full, layer = _leaf(S)
    y, new = chunk_kernel.wkv_chunk_varlen(r, w, k, v, kk, a, full, cu_seqlens(segs), layer=layer,
                                           interpret=interpret)
    return y, _like(S, new)


def wkv_seq(r, w, k, v, kk, a, S, *, interpret: bool):
    """Contract wkv_seq (S rows or a LayerSlice, as in `wkv_varlen`): the chunked kernel on the
    flattened rows past one chunk, else the per-token sequence kernel (on the layer's rows)."""
    B, T, H, N = r.shape
    if T <= chunk_kernel.CHUNK:
        rows = S.rows() if isinstance(S, LayerSlice) else S
        y, rows = wkv_seq_kernel.wkv_seq(r, w, k, v, kk, a, rows, interpret=interpret)
        return y, (S.replace(rows) if isinstance(S, LayerSlice) else rows)
    fr, fw, fk, fv, fkk, fa = (x.reshape(B * T, H, N) for x in (r, w, k, v, kk, a))
    cu = jnp.arange(0, B * T + 1, T, dtype=jnp.int32)
    full, layer = _leaf(S)
    y, new = chunk_kernel.wkv_chunk_varlen(fr, fw, fk, fv, fkk, fa, full, cu, layer=layer, interpret=interpret)
    return y.reshape(B, T, H, N), _like(S, new)


def wkv_operands(r, k, v, w_l, a_l, v_l, vecs, v_first, *, n_head: int, interpret: bool):
    """Contract of ``wkv_operands_reference`` in one launch (``pallas_kernels.wkv_operands``) where
    the kernel serves the width, else the reference."""
    if operands_kernel.supports(r.shape[1], n_head):
        return operands_kernel.wkv_operands(r, k, v, w_l, a_l, v_l, vecs, v_first, n_head=n_head, interpret=interpret)
    return wkv_operands_reference(r, k, v, w_l, a_l, v_l, vecs, v_first, n_head=n_head)


def wkv_output(y, r, k, v, g, vecs, r_k, dtype, *, interpret: bool):
    """Contract of ``wkv_output_reference`` in one launch (``pallas_kernels.wkv_output``) where
    the kernel serves the shape, else the reference."""
    _, H, N = y.shape
    if operands_kernel.supports(H * N, H):
        return output_kernel.wkv_output(y, r, k, v, g, vecs, r_k, dtype, interpret=interpret)
    return wkv_output_reference(y, r, k, v, g, vecs, r_k, dtype)


def shift_mix_rows(h, delta, shift, ln_w, ln_b, mix, links, *, interpret: bool):
    """Contract shift_mix_rows; a LayerSlice shift is read from its whole leaf (no slice copy)."""
    full, layer = _leaf(shift)
    return shift_mix_rows_kernel.shift_mix_rows(h, delta, full, ln_w, ln_b, mix, links, layer=layer,
                                                interpret=interpret)


def pallas_ops(path: Path, interpret: bool) -> Ops:
    """The Ops for `path` built on the Pallas kernels; interpret=True runs them on the CPU."""
    if not isinstance(path, Path):
        raise ValueError(f"path must be a rwkv_jax.Path, got {path!r}")
    if path is Path.DENSE:
        time_mix = functools.partial(XLA_OPS.time_mix, operands=functools.partial(wkv_operands, interpret=interpret),
                                     output=functools.partial(wkv_output, interpret=interpret))
        return XLA_OPS._replace(time_mix=time_mix, wkv_seq=functools.partial(wkv_seq, interpret=interpret),
                                wkv_varlen=functools.partial(wkv_varlen, interpret=interpret),
                                shift_mix_rows=functools.partial(shift_mix_rows, interpret=interpret),
                                state_views=RowsState)
    max_rows = 1 if path is Path.B1T1 else linear_kernel.MAX_M
    lin = functools.partial(linear, max_rows=max_rows, interpret=interpret)
    return Ops(
        linear=lin,
        shift_mix=functools.partial(in_place_shift_mix, interpret=interpret),
        wkv_step=functools.partial(wkv_step, interpret=interpret),
        wkv_seq=XLA_OPS.wkv_seq,
        channel_mix=functools.partial(channel_mix, max_rows=max_rows, interpret=interpret),
        time_mix=functools.partial(time_mix_reference, linear=lin),
        state_views=InPlaceState,
    )


def wkv_step(r, w, k, v, kk, a, S, *, interpret: bool):
    """Contract wkv_step on a LayerSlice state (the whole leaf, its layer stepped in place) or
    on plain rows [B, H, N, N]."""
    full, layer = _leaf(S)
    y, new = wkv_step_kernel.wkv_step(r, w, k, v, kk, a, full, layer=layer, interpret=interpret)
    return y, _like(S, new)


def in_place_shift_mix(h, delta, shift: LayerSlice, ln_w, ln_b, mix, *, interpret: bool,
                       kernel=shift_mix_kernel.shift_mix):
    """Contract shift_mix on a LayerSlice shift (the whole leaf, updated in place); `kernel`:
    ``shift_mix.shift_mix``'s contract (the Triton one, or ``pallas_kernels.mosaic.shift_mix``)."""
    h, mixed, full = kernel(h, delta, shift.full, ln_w, ln_b, mix, layer=shift.layer, interpret=interpret)
    return h, mixed, LayerSlice(full, shift.layer)


def in_place_time_mix(mixed, wts, S: LayerSlice, v_first, *, first: bool, wkv, linear, interpret: bool,
                      kernels: fused_time_mix_kernel.FusedKernels = fused_time_mix_kernel.TRITON):
    """Contract time_mix on a LayerSlice state: the four fused launches (`kernels`: the set they
    launch, see ``fused_time_mix``), or (for shapes they do not serve) the reference on the
    layer's rows written back."""
    if fused_time_mix_kernel.supports(mixed.shape[1], wts):
        out, full, v_first = fused_time_mix_kernel.fused_time_mix(
            mixed, wts, S.full, v_first, first=first, layer=S.layer, interpret=interpret,
            kernels=kernels)
        return out, LayerSlice(full, S.layer), v_first
    out, rows, v_first = time_mix_reference(mixed, wts, S.rows(), v_first, first=first, linear=linear, wkv=wkv)
    return out, S.replace(rows), v_first


def fused_channel_mix(xk, w_key, w_val_t, *, fallback, interpret: bool,
                      kernels: fused_time_mix_kernel.FusedKernels = fused_time_mix_kernel.TRITON):
    """Contract channel_mix (a SplitSum result) by the fused kernels (`kernels`), else `fallback`;
    the value rows of zero activations are skipped while rows <= SPARSE_MAX_ROWS, as in `channel_mix`."""
    M = xk.shape[0]
    if fused_time_mix_kernel.channel_mix_supported(M, w_key, w_val_t):
        return fused_time_mix_kernel.fused_channel_mix(xk, w_key, w_val_t, skip=M <= SPARSE_MAX_ROWS,
                                                       interpret=interpret, kernels=kernels)
    return fallback(xk, w_key, w_val_t)


def fused_ops(path: Path, interpret: bool) -> Ops:
    """The fewer-launch Pallas Ops for `path` (see module doc); DENSE as in `pallas_ops`."""
    base = pallas_ops(path, interpret)
    if path is Path.DENSE:
        return base
    return base._replace(
        time_mix=functools.partial(in_place_time_mix, linear=base.linear, interpret=interpret),
        channel_mix=functools.partial(fused_channel_mix, fallback=base.channel_mix, interpret=interpret),
    )

