"""The decode step's recurrence through the native CPU kernels (``wkv_step.cc``), on the whole
state leaf.

``wkv_step(r, w, k, v, kk, a [B, H, N] float32, S [B, L, H, N, N], layer) -> (y [B, H, N]
float32, S')``: S' is S with layer ``layer`` stepped, written in place (the leaf is aliased to the
result, so a donated state is never copied). The step runs in float32; a bfloat16 / float16 state
is widened as it is read and rounded to nearest even as it is written (y comes from the float32
S', as in the reference). Contract: ``pallas_kernels.wkv_step.wkv_step_reference``.

``time_mix_step(r, k, v, w_l, a_l, v_l, g [B, C] float32, vecs [7, C], r_k [H, N], v_first [B, C]
float32 | None, S, layer, dtype) -> (out [B, C] dtype, S', v_first)``: the time-mix body between
its products and the output projection, the recurrence step among it, in one call (contract:
``pallas_kernels.time_mix``'s ``wkv_operands_reference``, the step and ``wkv_output_reference``).
The products' float32 results are rounded to ``dtype`` (the model's) first, as the reference's
products are; v_l and v_first are None on the first layer, whose v comes back as v_first.

``supports`` says which states they take (float32, bfloat16, float16 where the build has
``library.HALF_STATE``; N one of ``HEAD_SIZES``), ``time_mix_supports`` which model dtypes too
(float32, bfloat16, float16 with ``HALF_STATE``); others run the reference on the layer's rows.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rwkv7_core.constants import DECAY_SCALE, GROUP_NORM_EPS, KK_EPS

from . import library

HEAD_SIZES = (16, 32, 64, 128)  # wkv_step.cc's head_size_ok


def supports(S) -> bool:
    """Whether the native step takes the state leaf S [B, L, H, N, N]."""
    dtypes = (jnp.float32, jnp.bfloat16) + ((jnp.float16,) if library.HALF_STATE in library.load().capabilities else ())
    return S.dtype in dtypes and S.shape[-1] in HEAD_SIZES


def wkv_step(r, w, k, v, kk, a, S, layer: int):
    """See module doc; S must satisfy ``supports``."""
    library.load()
    out = (jax.ShapeDtypeStruct(r.shape, jnp.float32), jax.ShapeDtypeStruct(S.shape, S.dtype))
    call = jax.ffi.ffi_call("rwkv7_wkv_step", out, input_output_aliases={6: 1})
    return call(*(x.astype(jnp.float32) for x in (r, w, k, v, kk, a)), S, layer=np.int64(layer))


def time_mix_supports(S, dtype) -> bool:
    """Whether ``time_mix_step`` takes the state leaf S and model dtype ``dtype``."""
    return supports(S) and (jnp.dtype(dtype) in (jnp.float32, jnp.bfloat16) or
                            (jnp.dtype(dtype) == jnp.float16 and library.HALF_STATE in library.load().capabilities))


def time_mix_step(r, k, v, w_l, a_l, v_l, g, vecs, r_k, v_first, S, layer: int, dtype):
    """See module doc; S and dtype must satisfy ``time_mix_supports``."""
    library.load()
    B, C = r.shape
    rows = jax.ShapeDtypeStruct((B, C), jnp.float32)
    first = v_first is None
    outs = (jax.ShapeDtypeStruct((B, C), dtype), jax.ShapeDtypeStruct(S.shape, S.dtype), *((rows,) if first else ()))
    call = jax.ffi.ffi_call("rwkv7_time_mix_step", outs, input_output_aliases={8: 1})
    f32 = [x.astype(jnp.float32) for x in (r, k, v, w_l, a_l, g, vecs, r_k)]
    rest = () if first else (v_l.astype(jnp.float32), v_first.astype(jnp.float32))
    out, S, *made = call(*f32, S, *rest, layer=np.int64(layer), decay_scale=np.float32(DECAY_SCALE),
                         kk_eps=np.float32(KK_EPS), norm_eps=np.float32(GROUP_NORM_EPS))
    return out, S, made[0] if first else v_first
