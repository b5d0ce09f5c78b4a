"""The kernel-op contract: the hot pieces of a layer, swappable per path.

The model's layer code calls only these ops for its hot pieces; ``ops_for(path, kernels)``
picks the implementation. The plain-XLA versions live here; Pallas versions come from
``rwkv_jax.pallas_ops.pallas_ops(path, interpret)``. Shapes and dtypes (x dtype = the
model dtype unless stated):

- ``linear(x [M, K], w [N, K]) -> [M, N]``: x @ w.T, float32 accumulation, result x.dtype.
- ``shift_mix(h [B, C], delta [B, C] | None, shift [B, C], ln_w [C], ln_b [C], mix [n, C])
  -> (h_out [B, C], mixed [n, B, C], x_ln [B, C])``: h_out = h + delta (h if None);
  x_ln = LayerNorm(h_out) (eps 1e-5, statistics in float32); mixed[i] = x_ln + (shift -
  x_ln) * mix[i]; x_ln is the new shift state.
- ``wkv_step(r, w, k, v, kk, a [B, H, N] float32, S [B, H, N, N] float32) -> (y [B, H, N], S')``
- ``wkv_seq(r, w, k, v, kk, a [B, T, H, N] float32, S [B, H, N, N] float32) -> (y [B, T, H, N], S')``
  One step: S' = S * w[None, :] + (S @ -kk)[:, None] * (kk * a)[None, :] + v[:, None] * k[None, :];
  y = S' @ r (per head; S rows = value dim, cols = key dim). w is the decay multiplier,
  kk is L2-normalised, k is already k * (1 + (a - 1) * k_a).
- ``channel_mix(xk [M, C], w_key [F, C], w_val_t [F, C]) -> [M, C]``:
  relu(xk @ w_key.T) ** 2 @ w_val_t, square in float32, result xk.dtype. The value weight
  comes transposed from the checkpoint's ffn.value [C, F] (done once at load) so that each
  hidden unit owns one contiguous row, which a sparse kernel can skip when its activation
  is exactly zero. float16 keeps the squared activations in float32 (they overflow past
  a pre-activation of ~255); other dtypes round them to the model dtype.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .paths import Path

KERNELS = ("xla", "pallas", "pallas-interpret", "auto")
LN_EPS = 1e-5
_HIGHEST = lax.Precision.HIGHEST


class Ops(NamedTuple):
    """One implementation of each hot op (see the module docstring for shapes)."""

    linear: Callable
    shift_mix: Callable
    wkv_step: Callable
    wkv_seq: Callable
    channel_mix: Callable


# ----------------------------------------------------------------------------- XLA versions
def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float = LN_EPS) -> jax.Array:
    """LayerNorm over the last axis with float32 statistics; result in x.dtype."""
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    out = (xf - mean) * lax.rsqrt(var + eps) * weight.astype(jnp.float32) + bias.astype(jnp.float32)
    return out.astype(x.dtype)


def _dot_f32(x: jax.Array, w: jax.Array, w_in_axis: int = 1) -> jax.Array:
    """x [M, K] @ w -> [M, N] float32 (operands in x.dtype); w is [N, K] (w_in_axis=1) or
    [K, N] (w_in_axis=0)."""
    if x.shape[0] == 1 and x.dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
        # XLA:CPU's bfloat16 matrix-vector product runs ~8x slower than its 2-row product
        # (measured on [1, 768] x [12288, 768]); compute two identical rows, keep one.
        return _dot_f32(jnp.concatenate([x, x]), w, w_in_axis)[:1]
    return lax.dot_general(x, w.astype(x.dtype), (((1,), (w_in_axis,)), ((), ())),
                           preferred_element_type=jnp.float32)


def xla_linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [M, K] @ w [N, K].T -> [M, N] in x.dtype, accumulated in float32."""
    return _dot_f32(x, w).astype(x.dtype)


def xla_shift_mix(h, delta, shift, ln_w, ln_b, mix):
    """Fused residual add + LayerNorm + token-shift mixes for one token per row."""
    h_out = h if delta is None else h + delta.astype(h.dtype)
    x_ln = layer_norm(h_out, ln_w, ln_b)
    mixed = x_ln[None] + (shift.astype(x_ln.dtype) - x_ln)[None] * mix[:, None, :].astype(x_ln.dtype)
    return h_out, mixed, x_ln


def xla_wkv_step(r, w, k, v, kk, a, S):
    """One recurrence step for every (batch, head); all float32."""
    sa = jnp.einsum("bhij,bhj->bhi", S, -kk, precision=_HIGHEST)
    S = S * w[:, :, None, :] + sa[..., None] * (kk * a)[:, :, None, :] + v[..., None] * k[:, :, None, :]
    y = jnp.einsum("bhij,bhj->bhi", S, r, precision=_HIGHEST)
    return y, S


def xla_wkv_seq(r, w, k, v, kk, a, S):
    """The recurrence over T steps under lax.scan (time-major inside)."""
    def step(S, xs):
        y, S = xla_wkv_step(*xs, S)
        return S, y

    xs = tuple(jnp.moveaxis(t, 1, 0) for t in (r, w, k, v, kk, a))
    S, ys = lax.scan(step, S, xs)
    return jnp.moveaxis(ys, 0, 1), S


def hidden_dtype(dtype):
    """dtype of the squared channel-mix activations: float32 for float16 (overflow), else dtype."""
    return jnp.float32 if jnp.dtype(dtype) == jnp.float16 else dtype


def xla_channel_mix(xk: jax.Array, w_key: jax.Array, w_val_t: jax.Array) -> jax.Array:
    """relu(xk @ w_key.T) ** 2 @ w_val_t with the square in float32; result xk.dtype."""
    hidden = jnp.square(jnp.maximum(_dot_f32(xk, w_key), 0.0)).astype(hidden_dtype(xk.dtype))
    return _dot_f32(hidden, w_val_t, w_in_axis=0).astype(xk.dtype)


XLA_OPS = Ops(linear=xla_linear, shift_mix=xla_shift_mix, wkv_step=xla_wkv_step,
              wkv_seq=xla_wkv_seq, channel_mix=xla_channel_mix)


# ----------------------------------------------------------------------------- selection
def resolve_kernels(kernels: str) -> str:
    """Map "auto" to "pallas" on a GPU backend and "xla" elsewhere; validate the name."""
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {KERNELS}")
    if kernels == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "xla"
    return kernels


def ops_for(path: Path, kernels: str) -> Ops:
    """The Ops implementing `path` with the named kernels (xla | pallas | pallas-interpret | auto)."""
    if not isinstance(path, Path):
        raise ValueError(f"path must be a rwkv_jax.Path, got {path!r}")
    kernels = resolve_kernels(kernels)
    if kernels == "xla":
        return XLA_OPS
    try:
        from .pallas_ops import pallas_ops
    except ImportError as e:
        raise ValueError(f"kernels={kernels!r} needs rwkv_jax/pallas_ops.py, which could not be "
                         f"imported ({type(e).__name__}: {e}); use kernels='xla'") from e
    return pallas_ops(path, interpret=(kernels == "pallas-interpret"))
