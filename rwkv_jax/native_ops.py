"""The ``native`` kernels' Ops: XLA's, with the native CPU kernels (``cpu_kernels``) swapped in.

Every path: the matrix products of a few rows (the projections, the LoRA products, the
channel-mix and the head) run ``cpu_kernels.linear``; more rows fall back to XLA's GEMM inside
the same op. A layer's products on the token-shift mixes (r, k, v and the LoRA down products)
run as one call, and so do its LoRA up products (``matmul_group``: one hand-out of work to the
thread pool instead of one per product, see docs/benchmarks.md). Decode paths (B1T1,
BATCHED_DECODE) also run each layer's time-mix body between its products and the output projection
(the wkv operands, the recurrence step on the whole wkv leaf in place, the GroupNorm, bonus and
gate) as one call, ``cpu_kernels.wkv_step.time_mix_step`` (XLA:CPU ran it as ~25 thunks a layer),
and keep each layer's new shift rows to stack once at the end (``RowsState``): writing
them back layer by layer cost a dynamic-update-slice of the whole shift leaf per layer (2.1 of
the 0.1b bfloat16 B = 32 step's 29 ms).
"""
from __future__ import annotations

import functools

from cpu_kernels import library
from cpu_kernels import shift_mix as shift_mix_kernel
from cpu_kernels import wkv_step as wkv_kernel
from cpu_kernels.linear import matmul_f32, matmul_group
from pallas_kernels.shift_mix import shift_mix_reference
from pallas_kernels.small_m_linear import linear_reference
from pallas_kernels.sparse_channel_mix import channel_mix_reference
from pallas_kernels.time_mix import TimeMixWeights, lora_up_reference, time_mix_reference
from pallas_kernels.wkv_step import wkv_step_reference

from .ops import XLA_OPS, Ops
from .paths import Path
from .state_views import LayerSlice, RowsState


def wkv_step(r, w, k, v, kk, a, S: LayerSlice):
    """Contract wkv_step on a LayerSlice state: the native step in place, or (for states it does
    not take, ``cpu_kernels.wkv_step.supports``) the reference on the layer's rows written back."""
    if wkv_kernel.supports(S.full):
        y, full = wkv_kernel.wkv_step(r, w, k, v, kk, a, S.full, S.layer)
        return y, LayerSlice(full, S.layer)
    y, rows = wkv_step_reference(r, w, k, v, kk, a, S.rows())
    return y, S.replace(rows)


def shift_mix(h, delta, shift: LayerSlice, ln_w, ln_b, mix):
    """Contract shift_mix on a LayerSlice shift, its new shift rows [B, C] returned for
    ``RowsState`` to stack: the native kernel where it takes the inputs
    (``cpu_kernels.shift_mix.supports``), else the reference on the layer's rows."""
    if shift_mix_kernel.supports(h, shift.full):
        return shift_mix_kernel.shift_mix(h, delta, shift.full, shift.layer, ln_w, ln_b, mix)
    return shift_mix_reference(h, delta, shift.rows(), ln_w, ln_b, mix)


def time_mix(mixed, wts: TimeMixWeights, S: LayerSlice, v_first, *, first: bool, wkv, linear):
    """Contract time_mix on a LayerSlice wkv state: the products (``matmul_group``, float32), then
    ``cpu_kernels.wkv_step.time_mix_step`` for the body, then the output projection; for states or
    dtypes it does not take (``time_mix_supports``), the reference with ``wkv``."""
    if not wkv_kernel.time_mix_supports(S.full, mixed.dtype):
        return time_mix_reference(mixed, wts, S, v_first, first=first, linear=linear, wkv=wkv, products=products)
    downs, inputs = wts.down(first)
    r, k, v, *hidden = matmul_group([(mixed[j], w) for w, j in zip(downs, inputs)])
    ups = lora_up_reference([h.astype(mixed.dtype) for h in hidden], wts.ups(first), wts.up_kinds(first), linear,
                            matmul_group)
    v_l = None if first else ups[2]
    out, full, v_first = wkv_kernel.time_mix_step(r, k, v, ups[0], ups[1], v_l, ups[-1], wts.vecs, wts.r_k, v_first,
                                                  S.full, S.layer, mixed.dtype)
    return linear(out, wts.output), LayerSlice(full, S.layer), v_first


def products(pairs):
    """The native ``products`` of time_mix_reference: ``matmul_group``, each result in its x's dtype."""
    return [y.astype(x.dtype) for (x, _), y in zip(pairs, matmul_group(pairs))]


def native_ops(path: Path) -> Ops:
    """The Ops of the ``native`` kernels for `path`; builds the library first (``library.load``),
    so a host that cannot build it fails here with ``NativeKernelsUnavailable``."""
    library.load()
    linear = functools.partial(linear_reference, matmul=matmul_f32)
    ops = XLA_OPS._replace(linear=linear, channel_mix=functools.partial(channel_mix_reference, matmul=matmul_f32),
                           time_mix=functools.partial(time_mix_reference, linear=linear, products=products))
    if path is Path.DENSE:
        return ops
    return ops._replace(wkv_step=wkv_step, shift_mix=shift_mix, state_views=RowsState,
                        time_mix=functools.partial(time_mix, linear=linear))
