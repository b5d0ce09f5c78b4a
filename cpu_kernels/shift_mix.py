"""The decode step's residual add + LayerNorm + token-shift mixes through the native CPU kernel
(``shift_mix.cc``'s ``rwkv7_shift_mix``), in the contract of
``pallas_kernels.shift_mix.shift_mix_reference`` with the shift given as a whole leaf and a layer.

``shift_mix(h, delta, shift, layer, ln_w, ln_b, mix) -> (h_out [B, C], MixRows of n [B, C],
x [B, C])``: h, delta (or None) [B, C], shift [B, L, C] (the layer's rows are read in place), all
float32 or all bfloat16 (delta is cast to h's dtype, as the reference does), ln_w, ln_b [C], mix
[n, C]; results in h's dtype, bfloat16 ones rounded where the reference rounds them. One call
instead of XLA's 7-13 thunks; the mixes come as separate arrays (``MixRows``), so the products
that take them copy no slice. ``supports`` says which inputs it takes (float32 or bfloat16, C a
multiple of 16); others run the reference.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.shift_mix_rows import MixRows
from rwkv7_core.constants import LN_EPS

from . import library
from .library import LANES

DTYPES = (jnp.float32, jnp.bfloat16)


def supports(h, shift) -> bool:
    """Whether the native kernel takes rows h [B, C] and the shift leaf [B, L, C]."""
    return h.dtype in DTYPES and shift.dtype == h.dtype and h.shape[-1] % LANES == 0


def shift_mix(h, delta, shift, layer: int, ln_w, ln_b, mix):
    """See module doc; h and shift must satisfy ``supports``."""
    library.load()
    B, C = h.shape
    n = mix.shape[0]
    rows = jax.ShapeDtypeStruct((B, C), h.dtype)
    call = jax.ffi.ffi_call("rwkv7_shift_mix", (rows, rows, *(rows,) * n))
    f32 = [a.astype(jnp.float32) for a in (ln_w, ln_b, mix)]
    extra = () if delta is None else (delta.astype(h.dtype),)
    h_out, x, *mixed = call(h, shift, *f32, *extra, layer=np.int64(layer), eps=np.float32(LN_EPS))
    return h_out, MixRows(mixed), x
