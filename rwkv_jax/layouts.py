"""How the token rows of one forward call are laid out, and what that changes.

The layer code works on flat rows ``[M, C]``. Only three things depend on how those rows
belong to sequences: the token shift (which row is a row's predecessor), the wkv
recurrence (which rows run in order from which state row) and which rows' logits come
back. Each layout implements those three:

- ``StepRows``: B sequences, one token each (B1T1, BATCHED_DECODE): the fused
  ``Ops.shift_mix`` and one ``Ops.wkv_step``; M = B.
- ``DenseRows(B, T, full_output)``: B sequences of T tokens, row b*T + t (DENSE): the shift
  within each sequence (``Ops.shift_mix_rows``) and ``Ops.wkv_seq``; M = B*T.
- ``FlatRows(segments, n_single)``: P sequences of any lengths flattened into one stream
  without padding between them (varlen prefill, mixed steps): the shift (``Ops.shift_mix_rows``)
  and the wkv recurrence reset at every sequence start (``rwkv_jax.varlen``); M = the stream length.
"""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from pallas_kernels.shift_mix_rows import dense_links, row_links

from .ops import Ops
from .varlen import Segments, cu_seqlens


class StepRows(NamedTuple):
    """One token per sequence: row b is sequence b."""

    def shift_mix(self, ops: Ops, h, delta, shift, ln_w, ln_b, mix):
        """h, delta [B, C], shift [B, C] -> (h_out, mixed [n, B, C], new shift [B, C])."""
        return ops.shift_mix(h, delta, shift, ln_w, ln_b, mix)

    def wkv(self, ops: Ops, S, *operands):
        """operands r, w, k, v, kk, a [B, H, N], S [B, H, N, N] -> (y [B, H, N], S')."""
        return ops.wkv_step(*operands, S)

    def outputs(self, h):
        return h


class DenseRows(NamedTuple):
    """B sequences of T tokens; row b*T + t is token t of sequence b."""

    B: int
    T: int
    full_output: bool

    def shift_mix(self, ops: Ops, h, delta, shift, ln_w, ln_b, mix):
        """h, delta [B*T, C], shift [B, C] -> (h_out, mixed MixRows [n, B*T, C], new shift [B, C]);
        token t mixes with the LayerNorm output of t - 1 (the carried shift at t = 0)."""
        return ops.shift_mix_rows(h, delta, shift, ln_w, ln_b, mix, jnp.asarray(dense_links(self.B, self.T)))

    def wkv(self, ops: Ops, S, *operands):
        """operands [B*T, H, N], S [B, H, N, N] -> (y [B*T, H, N], S')."""
        M, H, N = operands[0].shape
        y, S = ops.wkv_seq(*(x.reshape(self.B, self.T, H, N) for x in operands), S)
        return y.reshape(M, H, N), S

    def outputs(self, h):
        """Every row with full_output, else each sequence's last row [B, C]."""
        return h if self.full_output else h.reshape(self.B, self.T, -1)[:, -1]


class FlatRows(NamedTuple):
    """P sequences flattened into one stream (see rwkv_jax.varlen); the first n_single have
    at most one token (the decode rows of a mixed step)."""

    segments: Segments
    n_single: int = 0

    def shift_mix(self, ops: Ops, h, delta, shift, ln_w, ln_b, mix):
        """h, delta [T, C], shift [P, C] -> (h_out, mixed MixRows [n, T, C], new shift [P, C]);
        the shift resets at every sequence start (``rwkv_jax.varlen``)."""
        links = row_links(cu_seqlens(self.segments), h.shape[0])
        return ops.shift_mix_rows(h, delta, shift, ln_w, ln_b, mix, links)

    def wkv(self, ops: Ops, S, *operands):
        """operands [T, H, N], S [P, H, N, N] -> (y [T, H, N], S')."""
        return ops.wkv_varlen(*operands, S, self.segments, n_single=self.n_single)

    def outputs(self, h):
        """Each sequence's last row [P, C] (meaningless for empty sequences)."""
        segs = self.segments
        return h[jnp.clip(segs.starts + segs.lengths - 1, 0, h.shape[0] - 1)]


Layout = StepRows | DenseRows | FlatRows
