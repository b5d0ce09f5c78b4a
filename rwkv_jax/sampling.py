"""Batched on-device sampling in JAX: the math of ``rwkv7_core.sampling`` (the numpy
reference, which documents every step), traceable and jitted with the decode step. The
top-k/top-p threshold is found by a radix search instead of the reference's sort (the same
kept set; a [32, 65536] batch took 0.09 s against 0.6 s with the sort on a 2-core CPU).

Rows are independent: each row's draw depends only on its logits, its penalty counts, its
parameters and its (seed, position) hash noise, so batch size and slot do not matter.
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels import radix_search
from rwkv7_core.sampling import GOLDEN, HASH_M1, HASH_M2, NONFINITE_TOKEN, TOP_LOGPROBS, SamplingRows, TokenLogprobs


def lowbias32(x: jax.Array) -> jax.Array:
    """uint32 -> uint32 integer hash (wrapping arithmetic)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(HASH_M1)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(HASH_M2)
    return x ^ (x >> 16)


def gumbel_noise(seed: jax.Array, seed_hi: jax.Array, position: jax.Array, vocab_size: int) -> jax.Array:
    """float32 [B, V] Gumbel noise from seeds (uint32 low and high words [B]) and int32 positions [B]."""
    key = seed.astype(jnp.uint32) + lowbias32(position.astype(jnp.uint32) + jnp.uint32(1))
    key = lowbias32(key ^ lowbias32(seed_hi.astype(jnp.uint32)))
    token_hash = lowbias32(jnp.arange(vocab_size, dtype=jnp.uint32) + jnp.uint32(GOLDEN))
    bits = lowbias32(key[:, None] ^ token_hash[None, :])
    u = ((bits >> 8).astype(jnp.float32) + 0.5) * jnp.float32(2.0 ** -24)
    return -jnp.log(-jnp.log(u))


class SearchForm(str, enum.Enum):
    """How ``nucleus_mask`` finds its thresholds (``kernels.sampler_form`` picks it):

    - LOOP: 32 one-bit XLA passes in a fori_loop, and a batch with no top-k (or no sampling
      row, in ``sample_rows``) skips that work with a lax.cond: the CPU's form, where passes
      cost compute, not launches;
    - UNROLLED: XLA passes of 8 bits (batches of at most WIDE_PASS_ROWS rows) or 4 bits,
      unrolled, every row's draw computed: no device control flow;
    - PALLAS (+ _INTERPRET): 4-bit passes of ``pallas_kernels.radix_search``, one launch each
      (a vocabulary it does not take: UNROLLED), no device control flow."""

    LOOP = "loop"
    UNROLLED = "unrolled"
    PALLAS = "pallas"
    PALLAS_INTERPRET = "pallas-interpret"


WIDE_PASS_ROWS = 4
"""UNROLLED search: batches of at most this many rows test 255 candidates a pass (4 passes a
threshold), larger ones 15 (8 passes): fewer launches where the [B, candidates, V] compares
are cheap, fewer compares where they are not."""


def _smallest_key(keys: jax.Array, weights: jax.Array | None, limit: jax.Array, mass: bool,
                  form: SearchForm) -> jax.Array:
    """``pallas_kernels.radix_search``'s threshold (int32 [B]) in the given form."""
    B, V = keys.shape
    if form is SearchForm.LOOP:
        return radix_search.smallest_key_reference(keys, weights, limit, mass, unrolled=False)
    if form in (SearchForm.PALLAS, SearchForm.PALLAS_INTERPRET) and radix_search.supports(V):
        return radix_search.smallest_key(keys, weights, limit, mass, interpret=form is SearchForm.PALLAS_INTERPRET)
    return radix_search.smallest_key_reference(keys, weights, limit, mass, unrolled=True,
                                               bits=8 if B <= WIDE_PASS_ROWS else 4)


def nucleus_mask(z: jax.Array, top_k: jax.Array, top_p: jax.Array, form: SearchForm = SearchForm.LOOP,
                 z_max: jax.Array | None = None) -> jax.Array:
    """bool [B, V]: tokens kept by top-k (0 = off) then top-p on scaled logits z [B, V]
    (z_max: float32 [B], the rows' maxima, when the caller has them).

    The numpy reference's rule without sorting V logits: a token of logit v is kept when
    fewer than top_k logits exceed v and the softmax mass (over the top-k survivors) of the
    logits above v is below top_p. Both counts only grow as v falls, so the kept set is
    {z >= t}; t is found by a radix search on order-preserving keys (exact; see
    ``pallas_kernels.radix_search``): the count of keys above below k, then the sum of
    exp(z - max) over the survivors above below top_p times their total."""
    keys = radix_search.signed_keys(z)
    k = jnp.where(top_k > 0, top_k, z.shape[1]).astype(jnp.float32)

    def top_k_threshold():
        return _smallest_key(keys, None, k, False, form)

    if form is SearchForm.LOOP:
        t_k = jax.lax.cond(jnp.any(top_k > 0), top_k_threshold, lambda: jnp.full(k.shape, radix_search.LOWEST))
    else:
        t_k = top_k_threshold()
    z_max = z.max(axis=1) if z_max is None else z_max
    e = jnp.where(keys >= t_k[:, None], jnp.exp(z - z_max[:, None]), 0.0)
    t_p = _smallest_key(keys, e, top_p, True, form)
    return keys >= jnp.maximum(t_k, t_p)[:, None]


def _max_and_all(values: jax.Array, flags: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Row maxima of float32 values [B, V] and whether all bool flags [B, V] hold: one
    reduction."""
    return jax.lax.reduce((values, flags), (np.float32(-np.inf), np.True_),
                          lambda a, b: (jnp.maximum(a[0], b[0]), a[1] & b[1]), (1,))


def _first_argmax(values: jax.Array, ids: jax.Array) -> jax.Array:
    """ids [B, V] entry of the first maximum of each row of float32 values [B, V] (ids in
    increasing order along a row, as an iota is): one reduction."""
    def pick(a, b):
        first = (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))
        return jnp.where(first, a[0], b[0]), jnp.where(first, a[1], b[1])

    return jax.lax.reduce((values, ids), (np.float32(-np.inf), np.int32(np.iinfo(np.int32).max)), pick, (1,))[1]


def sample_rows(logits: jax.Array, counts: jax.Array, rows: SamplingRows, banned: jax.Array,
                positions: jax.Array, form: SearchForm = SearchForm.LOOP) -> jax.Array:
    """int32 [B] tokens from float32 logits [B, V]; NONFINITE_TOKEN for non-finite rows.
    One argmax serves both kinds of row: a greedy row's values are its penalised logits, a
    sampling row's its kept scaled logits plus noise; a non-finite row's ids are all
    NONFINITE_TOKEN. ``form`` (``SearchForm``): LOOP skips the nucleus and noise of a batch of
    greedy rows (lax.cond); the others compute every row's draw, no device control flow."""
    logits = logits.astype(jnp.float32)
    x = logits - rows.presence[:, None] * (counts > 0) - rows.frequency[:, None] * counts
    x = jnp.where(banned, -jnp.inf, x)
    sampling = rows.temperature > 0
    z = x / jnp.where(sampling, rows.temperature, 1.0)[:, None]
    z_max, finite = _max_and_all(z, jnp.isfinite(logits))
    ids = jnp.where(finite[:, None], jax.lax.broadcasted_iota(jnp.int32, z.shape, 1), NONFINITE_TOKEN)
    usable = finite[:, None] & (z > -jnp.inf)  # a non-finite row's values all tie at -inf

    def draw(_):
        keep = usable & (nucleus_mask(z, rows.top_k, rows.top_p, form, z_max) | ~sampling[:, None])
        noise = jnp.where(sampling[:, None], gumbel_noise(rows.seed, rows.seed_hi, positions, x.shape[1]), 0.0)
        return _first_argmax(jnp.where(keep, z + noise, -jnp.inf), ids)

    if form is not SearchForm.LOOP:
        return draw(None)
    return jax.lax.cond(jnp.any(sampling), draw, lambda _: _first_argmax(jnp.where(usable, z, -jnp.inf), ids), None)


def disallowed(banned: jax.Array, allowed: jax.Array | None) -> jax.Array:
    """bool [B, V]: the banned tokens [B, V] plus those the packed masks ``allowed`` int32 [B, W]
    (rwkv7_core/token_mask.py; None = all allowed) leave out."""
    if allowed is None:
        return banned
    B, V = banned.shape
    bits = jnp.right_shift(allowed[:, :, None], jnp.arange(32, dtype=jnp.int32)) & 1  # no gather: [B, W, 32]
    return banned | (bits.reshape(B, -1)[:, :V] == 0)


def update_counts(counts: jax.Array, tokens: jax.Array, decay: jax.Array) -> jax.Array:
    """Penalty counts [B, V] after emitting tokens [B]: counts * decay + onehot(tokens), one
    elementwise pass, materialised on its own (behind an optimization barrier, so XLA writes
    the donated buffer in place instead of making it an extra output of the sampler's first
    fusion and copying it back)."""
    onehot = jnp.arange(counts.shape[1], dtype=tokens.dtype)[None, :] == tokens[:, None]
    return jax.lax.optimization_barrier(counts * decay[:, None] + onehot.astype(counts.dtype))


def token_logprobs(logits: jax.Array, tokens: jax.Array, k: int = TOP_LOGPROBS) -> TokenLogprobs:
    """TokenLogprobs of tokens int [N] (negative ids score as 0) under float32 logits [N, V]:
    log_softmax, the token's entry and the top k (lax.top_k: lower id first on ties)."""
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    chosen = jnp.take_along_axis(lp, jnp.maximum(tokens, 0)[:, None].astype(jnp.int32), axis=1)[:, 0]
    top_lp, top_ids = jax.lax.top_k(lp, k)
    return TokenLogprobs(chosen, top_ids.astype(jnp.int32), top_lp)
