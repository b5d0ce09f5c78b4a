"""The kernel-op contract: the hot pieces of a layer, swappable per path.

The model's layer code calls only these ops for its hot pieces; ``rwkv_jax.kernels.ops_for
(path, kernels)`` picks the implementation. ``XLA_OPS`` are the plain-jnp references that sit
beside each Pallas kernel in ``pallas_kernels`` (one definition serves as the XLA path and
as the kernels' reference); ``rwkv_jax.pallas_ops`` builds the Pallas versions. Shapes and
dtypes (x dtype = the model dtype unless stated):

- ``linear(x [M, K], w [N, K]) -> [M, N]``: x @ w.T, float32 accumulation, result x.dtype.
- ``shift_mix(h [B, C], delta [B, C] | None, shift [B, C], ln_w [C], ln_b [C], mix [n, C])
  -> (h_out [B, C], mixed [n, B, C], x_ln [B, C])``: h_out = h + delta (h if None);
  x_ln = LayerNorm(h_out) (eps 1e-5, statistics in float32); mixed[i] = x_ln + (shift -
  x_ln) * mix[i] (in float32); x_ln is the new shift state.
- ``shift_mix_rows(h [M, C], delta [M, C] | None, shift [P, C], ln_w, ln_b, mix [n, C], links int32
  [2, M]) -> (h_out [M, C], mixed MixRows of n [M, C], new shift [P, C])``: shift_mix over the flat
  token rows of P sequences (dense or varlen prefill), the predecessor of each row and the last
  row of each sequence given by ``links`` (``pallas_kernels.shift_mix_rows``).
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
- ``time_mix(mixed [6, M, C], wts TimeMixWeights, S, v_first [M, C] float32 | None, *, first,
  wkv) -> (out [M, C], S', v_first)``: the time-mix body through the output projection
  (``pallas_kernels.time_mix.time_mix_reference``); wkv(S, r, w, k, v, kk, a) is the layout's
  recurrence. The fused decode ops return `out` (and channel_mix its result) as a
  ``SplitSum`` (unreduced split-K partials) that their shift_mix takes as `delta` and that
  ``h + out`` sums.
- ``wkv_varlen(r, w, k, v, kk, a [T, H, N] float32, S [P, H, N, N] float32, segments, *, n_single)
  -> (y [T, H, N], S')``: the recurrence over a flat stream of P contiguous sequences
  (``rwkv_jax.varlen``; each from its own state row; rows past the last sequence give 0).
- Quantized models (``rwkv7_core.quantization``) pass a ``pallas_kernels.quantized.QuantizedWeight``
  for the large projections (always [out, in], the channel-mix value [C, F] too); the XLA ops
  take it (``matmul_f32`` dequantizes inside the product), the Pallas ones dequantize tiles in
  registers (``pallas_kernels.quantized_linear``, ``rwkv_jax.pallas_ops``).
- ``state_views(state) -> SlicedState | InPlaceState``: how the layer loop hands each layer its
  state (``rwkv_jax.state_views``): per-layer slices, or whole leaves updated in place.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from pallas_kernels.shift_mix import shift_mix_reference
from pallas_kernels.shift_mix_rows import shift_mix_rows_reference
from pallas_kernels.small_m_linear import linear_reference
from pallas_kernels.sparse_channel_mix import channel_mix_reference
from pallas_kernels.time_mix import time_mix_reference
from pallas_kernels.wkv_seq import wkv_seq_reference
from pallas_kernels.wkv_step import wkv_step_reference

from .state_views import SlicedState
from .varlen import wkv_varlen


class Ops(NamedTuple):
    """One implementation of each hot op (see the module docstring for shapes)."""

    linear: Callable
    shift_mix: Callable
    wkv_step: Callable
    wkv_seq: Callable
    channel_mix: Callable
    time_mix: Callable
    state_views: Callable = SlicedState
    wkv_varlen: Callable = functools.partial(wkv_varlen, wkv_step=wkv_step_reference)
    shift_mix_rows: Callable = shift_mix_rows_reference


XLA_OPS = Ops(linear=linear_reference, shift_mix=shift_mix_reference, wkv_step=wkv_step_reference,
              wkv_seq=wkv_seq_reference, channel_mix=channel_mix_reference,
              time_mix=functools.partial(time_mix_reference, linear=linear_reference))
