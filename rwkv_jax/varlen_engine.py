"""The pure functions behind ``JaxEngine.prefill_varlen`` and ``JaxEngine.mixed_step``.

- ``varlen_prefill_fn``: several prompt pieces in one flattened forward (``varlen_forward_fn``),
  each from its own start row; returns one (State with B=1, logits [V]) per piece row.
- ``mixed_step_fn``: one decode step for every slot AND the prompt pieces in the same forward
  (decode rows are length-1 sequences ahead of the pieces), then on-device sampling of the
  slots exactly as the decode step does.
- ``pack_pieces``: the host-side inputs of either call: pieces padded to ``token_rows`` flat
  tokens and ``MAX_PIECES`` piece rows, so each call compiles once (per bucket).
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from rwkv7_core.engine import MAX_PIECES, Slots

from .forward import varlen_forward_fn
from .kernels import sampler_form
from .sampling import disallowed, sample_rows, update_counts
from .state import State
from .varlen import segments_from_lengths


def _stack(rows: Sequence[State]) -> State:
    return State(*(jnp.concatenate(leaves, axis=0) for leaves in zip(*rows)))


def _split(logits, state: State, first: int) -> tuple:
    """Rows first.. of a [P] output as a tuple of (State B=1, logits [V])."""
    return tuple((State(*(leaf[p:p + 1] for leaf in state)), logits[p])
                 for p in range(first, logits.shape[0]))


def varlen_prefill_fn(params, tokens, rows, starts, lengths, *, config, kernels):
    """tokens int32 [T]; rows: MAX_PIECES States with B=1; starts, lengths int32 [MAX_PIECES]."""
    logits, state = varlen_forward_fn(params, tokens, _stack(rows), starts, lengths,
                                      config=config, kernels=kernels)
    return _split(logits, state, 0)


def mixed_step_fn(params, slots: Slots, tokens, positions, chunk, rows, starts, lengths, allowed=None, *, config,
                  kernels):
    """The decode step of every slot (tokens, positions int32 [B], packed token masks int32
    [B, W] or None) plus the pieces (chunk int32 [T], rows, starts, lengths as in
    varlen_prefill_fn) -> (drawn [B], slots, piece rows)."""
    B = tokens.shape[0]
    counts = update_counts(slots.counts, tokens, slots.rows.decay)
    state = State(*(jnp.concatenate(pair, axis=0) for pair in zip(slots.state, _stack(rows))))
    logits, state = varlen_forward_fn(
        params, jnp.concatenate([tokens, chunk]), state,
        jnp.concatenate([jnp.arange(B, dtype=jnp.int32), starts + B]),
        jnp.concatenate([jnp.ones(B, jnp.int32), lengths]),
        config=config, kernels=kernels, n_single=B)
    drawn = sample_rows(logits[:B], counts, slots.rows, disallowed(slots.banned, allowed), positions,
                        sampler_form(kernels))
    slots = slots._replace(state=State(*(leaf[:B] for leaf in state)), counts=counts)
    return drawn, slots, _split(logits, state, B)


def pack_pieces(prompts: Sequence[np.ndarray], starts: Sequence, token_rows: int, zero_row: State):
    """(flat tokens int32 [token_rows], MAX_PIECES start States, seg starts, seg lengths, n)
    for 1..MAX_PIECES non-empty pieces; a None start is the fresh ``zero_row``."""
    prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
    if not 1 <= len(prompts) <= MAX_PIECES or len(starts) != len(prompts):
        raise ValueError(f"need 1..{MAX_PIECES} prompt pieces with one start row each, got "
                         f"{len(prompts)} pieces and {len(starts)} starts")
    if any(p.size == 0 for p in prompts):
        raise ValueError("every prompt piece needs at least one token")
    lengths = [p.size for p in prompts]
    if token_rows < sum(lengths):
        raise ValueError(f"token_rows={token_rows} cannot hold {sum(lengths)} prompt tokens")
    flat = np.zeros(token_rows, np.int32)
    flat[:sum(lengths)] = np.concatenate(prompts)
    rows = [zero_row if s is None else s[0] for s in starts]
    rows += [zero_row] * (MAX_PIECES - len(rows))
    segs = segments_from_lengths(lengths, MAX_PIECES)
    return flat, tuple(rows), segs.starts, segs.lengths, len(prompts)
