"""One recurrence step through the native CPU kernel (``linear.cc``'s ``rwkv7_wkv_step``), in
the contract of ``pallas_kernels.wkv_step.wkv_step_reference`` on the whole state leaf.

``wkv_step(r, w, k, v, kk, a [B, H, N] float32, S [B, L, H, N, N], layer) -> (y [B, H, N]
float32, S')``: S' is S with layer ``layer`` stepped, written in place (the leaf is aliased to the
result, so a donated state is never copied). The step runs in float32; a bfloat16 / float16 state
is widened as it is read and rounded to nearest even as it is written (y comes from the float32
S', as in the reference). ``supports`` says which states it takes (float32, bfloat16, float16 where
the build has ``library.HALF_STATE``; N a multiple of 16); others run the reference on the layer's
rows.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import library
from .library import LANES


def supports(S) -> bool:
    """Whether the native step takes the state leaf S [B, L, H, N, N]."""
    dtypes = (jnp.float32, jnp.bfloat16) + ((jnp.float16,) if library.HALF_STATE in library.load().capabilities else ())
    return S.dtype in dtypes and S.shape[-1] % LANES == 0


def wkv_step(r, w, k, v, kk, a, S, layer: int):
    """See module doc; S must satisfy ``supports``."""
    library.load()
    out = (jax.ShapeDtypeStruct(r.shape, jnp.float32), jax.ShapeDtypeStruct(S.shape, S.dtype))
    call = jax.ffi.ffi_call("rwkv7_wkv_step", out, input_output_aliases={6: 1})
    return call(*(x.astype(jnp.float32) for x in (r, w, k, v, kk, a)), S, layer=np.int64(layer))
