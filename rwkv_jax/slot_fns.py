"""The pure functions behind ``JaxEngine``'s decode step, prompt pieces and slot operations
(``varlen_engine.py`` holds those of the varlen prefill and the mixed step).

Slots are ``rwkv7_core.engine.Slots`` with a leading [bucket] axis; a row is a State with B=1.
Rows and slots hold the wkv leaf in the model's state dtype (``rwkv7_core.state``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rwkv7_core.engine import Slots
from rwkv7_core.sampling import SamplingRows, sampling_rows

from .forward import forward_fn
from .kernels import sampler_form
from .sampling import disallowed, sample_rows, token_logprobs, update_counts
from .state import State, init_state


def decode_step(params, slots: Slots, tokens, positions, allowed=None, *, config, path, kernels, with_logprobs=False):
    """tokens, positions int32 [B] (allowed: packed token masks int32 [B, W] or None) ->
    (drawn int32 [B], TokenLogprobs of them or None, new slots)."""
    logits, slots = decode_forward(params, slots, tokens, config=config, path=path, kernels=kernels)
    drawn = decode_sample(logits, slots, positions, allowed, kernels=kernels)
    scored = token_logprobs(logits, drawn) if with_logprobs else None
    return drawn, scored, slots


def decode_forward(params, slots: Slots, tokens, *, config, path, kernels):
    """The first half of ``decode_step``: tokens int32 [B] counted and fed -> (logits [B, V],
    slots with the new state and penalty counts)."""
    counts = update_counts(slots.counts, tokens, slots.rows.decay)
    logits, state = forward_fn(params, tokens[:, None], slots.state, config=config, path=path, kernels=kernels)
    return logits, slots._replace(state=state, counts=counts)


def decode_sample(logits, slots: Slots, positions, allowed=None, *, kernels):
    """The second half of ``decode_step``: drawn int32 [B] from the forward's logits [B, V] and
    slots, positions int32 [B] and packed masks int32 [B, W] (or None)."""
    return sample_rows(logits, slots.counts, slots.rows, disallowed(slots.banned, allowed), positions,
                       sampler_form(kernels))


def score_piece(params, tokens, next_tokens, state, *, config, path, kernels):
    """Full-output prefill of one piece: TokenLogprobs of next_tokens int32 [T] under the logits
    after each token of tokens int32 [T], and the state after the piece."""
    logits, state = forward_fn(params, tokens[None], state, config=config, path=path, kernels=kernels,
                               full_output=True)
    return token_logprobs(logits.reshape(tokens.shape[0], -1), next_tokens), state  # [1, V] when T = 1


def prefill_piece(params, tokens, state, *, config, path, kernels):
    """tokens int32 [T] from a B=1 state -> (logits float32 [V] after the last token, new state)."""
    logits, state = forward_fn(params, tokens[None], state, config=config, path=path, kernels=kernels)
    return logits[0], state


def sample_one(logits, rows: SamplingRows, banned, position, allowed=None):
    """A token drawn from logits float32 [V] with zero penalty counts (rows, banned [1, V],
    position int32 [1] and packed mask int32 [1, W] or None of one slot), as ``decode_step`` draws it."""
    return sample_rows(logits[None], jnp.zeros_like(banned, jnp.float32), rows, disallowed(banned, allowed),
                       position)[0]


def row_logprobs(logits, token):
    """TokenLogprobs (N=1) of token int32 [1] under a row's logits float32 [V]."""
    return token_logprobs(logits[None], token)


def empty_slots(*, config, dtype, state_dtype, bucket: int) -> Slots:
    """Slots of ``bucket`` zero rows (zero states: shifts in ``dtype``, wkv in ``state_dtype``;
    zero counts and sampling rows; nothing banned)."""
    V = config.vocab_size
    rows = SamplingRows(*(jnp.zeros((bucket,), a.dtype) for a in sampling_rows([])))
    return Slots(init_state(config, bucket, dtype, state_dtype), jnp.zeros((bucket, V), jnp.float32),
                 jnp.zeros((bucket, V), jnp.bool_), rows)


def insert(slots: Slots, slot, state: State, rows: SamplingRows, banned) -> Slots:
    """slots with row ``slot`` (int32 scalar) set to the B=1 state, rows and banned [1, V], counts zero."""
    def put(big, small):
        return jax.lax.dynamic_update_index_in_dim(big, small.astype(big.dtype), slot, 0)
    return Slots(state=jax.tree.map(put, slots.state, state),
                 counts=put(slots.counts, jnp.zeros_like(slots.counts[:1])),
                 banned=put(slots.banned, banned),
                 rows=jax.tree.map(put, slots.rows, rows))


def extract(state: State, slot) -> State:
    """Row ``slot`` (int32 scalar) of a batched state, as a B=1 state."""
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0), state)


def gather(slots: Slots, index) -> Slots:
    """Slots whose row i is slots' row index[i] (index int32 [new bucket])."""
    return jax.tree.map(lambda x: jnp.take(x, index, axis=0), slots)


def copy_row(state: State) -> State:
    """A copy of a B=1 state on its own buffers."""
    return jax.tree.map(jnp.copy, state)
