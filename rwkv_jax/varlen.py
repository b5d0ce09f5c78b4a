"""Variable-length ("varlen") pieces: several sequences flattened into one token stream.

Tokens of P sequences are concatenated without padding; sequence p owns the flat
positions [starts[p], starts[p] + lengths[p]). Every per-token matrix product runs over
the flat rows at once; only the two sequential pieces need to know where sequences
begin:

- the token shift (``Ops.shift_mix_rows`` with ``pallas_kernels.shift_mix_rows.row_links``
  built from `cu_seqlens`): a sequence's first token sees that sequence's carried shift state,
  not the previous sequence's last token;
- the wkv recurrence (`wkv_varlen`): each sequence starts from its own state row and
  its final state lands in its own row. Length-1 sequences (decode rows of a mixed
  step) take one batched `wkv_step`; longer ones run token by token through the flat
  stream with the model's `wkv_step` on one row (measured on the CPU: stepping all
  sequences in parallel for max(lengths) steps costs 2x more per token when one long
  prompt fills the call, because every step then carries the padded rows too).

On the GPU kernels the recurrence is one launch of the chunked kernel instead
(``pallas_kernels.wkv_chunk_varlen``, taking `cu_seqlens`); this loop is the XLA op.
Empty sequences (length 0) are allowed anywhere and leave their state row unchanged.
Flat positions at or past starts[-1] + lengths[-1] are padding (outputs zero).
`wkv_varlen_reference` is the plain per-sequence loop the segmented scan must equal.

The whole model runs over such a stream with the ``rwkv_jax.layouts.FlatRows`` layout
(``rwkv_jax.forward.varlen_forward_fn``): varlen prefill of several prompts (each from
its own state row) and the "mixed" step (decode rows as length-1 sequences beside
prompt pieces) are both that one function.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Segments(NamedTuple):
    """Where each flattened sequence lives: starts, lengths int32 [P] (device or numpy)."""

    starts: jax.Array
    lengths: jax.Array


def segments_from_lengths(lengths, n_seqs: int | None = None) -> Segments:
    """Host-side: contiguous segments for `lengths` (ints >= 0), padded with empty
    segments to `n_seqs` rows. Returns numpy int32 arrays."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if (lengths < 0).any():
        raise ValueError(f"sequence lengths must be >= 0, got {lengths.tolist()}")
    n_seqs = len(lengths) if n_seqs is None else n_seqs
    if n_seqs < len(lengths):
        raise ValueError(f"n_seqs={n_seqs} is smaller than the {len(lengths)} sequences given")
    padded = np.zeros(n_seqs, np.int64)
    padded[:len(lengths)] = lengths
    starts = np.concatenate([[0], np.cumsum(padded)[:-1]])
    return Segments(starts.astype(np.int32), padded.astype(np.int32))


def cu_seqlens(segs: Segments) -> jax.Array:
    """int32 [P + 1]: sequence p spans [cu[p], cu[p + 1]) (fla's form). Segments are
    contiguous from position 0, as `segments_from_lengths` and the mixed step build them."""
    return jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(segs.lengths, dtype=jnp.int32)])


WkvStep = Callable[..., tuple[jax.Array, jax.Array]]


def wkv_varlen(r, w, k, v, kk, a, state0: jax.Array, segs: Segments, *,
               wkv_step: WkvStep, n_single: int = 0) -> tuple[jax.Array, jax.Array]:
    """Segmented wkv recurrence over a flat token stream.

    r, w, k, v, kk, a: float32 [T, H, N] (the `Ops.wkv_step` operands per flat token);
    state0 [P, H, N, N] in a state dtype (carried in float32, rounded back at the end), one
    row per sequence; `wkv_step` an `Ops.wkv_step`.
    The first `n_single` sequences must have length <= 1 (decode rows in a mixed step):
    they take one batched step. The others run one token per loop step through the
    flat stream (sum of their lengths steps, one state row wide — the cost profile of a
    single-sequence scan), the state reset from the sequence's own row at its first
    token and written to its row at its last. Returns y float32 [T, H, N] (zero on
    padding) and the final states [P, H, N, N] in state0's dtype.
    """
    dtype, state0 = state0.dtype, state0.astype(jnp.float32)
    n_tokens = r.shape[0]
    operands = (r, w, k, v, kk, a)
    y = jnp.zeros_like(r)
    s_single, s_multi = state0[:n_single], state0[n_single:]
    if n_single:
        starts, lengths = segs.starts[:n_single], segs.lengths[:n_single]
        idx = jnp.minimum(starts, n_tokens - 1)
        y_t, new = wkv_step(*(o[idx] for o in operands), s_single)
        active = lengths > 0
        s_single = jnp.where(active[:, None, None, None], new, s_single)
        y = y.at[jnp.where(active, starts, n_tokens)].set(y_t, mode="drop")
    n_multi = state0.shape[0] - n_single
    if n_multi:
        starts, lengths = segs.starts[n_single:], segs.lengths[n_single:]
        ends = starts + lengths
        seg = jnp.minimum(jnp.searchsorted(ends, jnp.arange(n_tokens), side="right"), n_multi - 1)

        def body(t, carry):
            S, finals, y = carry
            p = seg[t]
            S = jnp.where(t == starts[p], s_multi[p], S)
            y_t, S = wkv_step(*(jax.lax.dynamic_index_in_dim(o, t, 0) for o in operands), S[None])
            y = jax.lax.dynamic_update_index_in_dim(y, y_t, t, 0)
            finals = jax.lax.dynamic_update_index_in_dim(finals, S, jnp.where(t == ends[p] - 1, p, n_multi), 0)
            return S[0], finals, y

        finals = jnp.concatenate([s_multi, jnp.zeros_like(s_multi[:1])], axis=0)  # + a discard row
        _, finals, y = jax.lax.fori_loop(starts[0], jnp.max(ends), body, (s_multi[0], finals, y))
        s_multi = finals[:n_multi]
    return y, jnp.concatenate([s_single, s_multi], axis=0).astype(dtype)


def wkv_varlen_reference(r, w, k, v, kk, a, state0, lengths, *, wkv_step: WkvStep
                         ) -> tuple[jax.Array, jax.Array]:
    """Plain reference: each sequence run alone, token by token (host loop).

    Same operands as `wkv_varlen` with `lengths` a host list; sequences are packed
    from position 0 in order. Returns (y [T, H, N], final states [P, H, N, N]).
    """
    y = jnp.zeros_like(r)
    finals = []
    pos = 0
    for p, n in enumerate(lengths):
        s = state0[p:p + 1]
        for t in range(pos, pos + n):
            y_t, s = wkv_step(*(o[t:t + 1] for o in (r, w, k, v, kk, a)), s)
            y = y.at[t].set(y_t[0])
        finals.append(s)
        pos += n
    return y, jnp.concatenate(finals, axis=0)
