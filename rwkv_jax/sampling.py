"""Batched on-device sampling in JAX: the math of ``scheduler.sampling`` (the numpy
reference, which documents every step), traceable and jitted with the decode step.

Rows are independent: each row's draw depends only on its logits, its penalty counts, its
parameters and its (seed, position) hash noise, so batch size and slot do not matter.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from scheduler.engine import NONFINITE_TOKEN
from scheduler.sampling import GOLDEN, HASH_M1, HASH_M2, SamplingRows


def lowbias32(x: jax.Array) -> jax.Array:
    """uint32 -> uint32 integer hash (wrapping arithmetic)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(HASH_M1)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(HASH_M2)
    return x ^ (x >> 16)


def gumbel_noise(seed: jax.Array, position: jax.Array, vocab_size: int) -> jax.Array:
    """float32 [B, V] Gumbel noise from uint32 seeds [B] and int32 positions [B]."""
    key = lowbias32(seed.astype(jnp.uint32) + lowbias32(position.astype(jnp.uint32) + jnp.uint32(1)))
    token_hash = lowbias32(jnp.arange(vocab_size, dtype=jnp.uint32) + jnp.uint32(GOLDEN))
    bits = lowbias32(key[:, None] ^ token_hash[None, :])
    u = ((bits >> 8).astype(jnp.float32) + 0.5) * jnp.float32(2.0 ** -24)
    return -jnp.log(-jnp.log(u))


def nucleus_mask(z: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """bool [B, V]: tokens kept by top-k (0 = off) then top-p on scaled logits z [B, V]."""
    sorted_z = jnp.flip(jnp.sort(z, axis=1), axis=1)
    rank = jnp.arange(z.shape[1])[None, :]
    sorted_z = jnp.where((top_k[:, None] > 0) & (rank >= top_k[:, None]), -jnp.inf, sorted_z)
    p = jnp.exp(sorted_z - sorted_z[:, :1])
    p = p / p.sum(axis=1, keepdims=True)
    keep = ((jnp.cumsum(p, axis=1) - p) < top_p[:, None]) & (sorted_z > -jnp.inf)
    last = (keep.sum(axis=1) - 1).clip(min=0)  # a NaN row keeps nothing: clamp
    threshold = jnp.take_along_axis(sorted_z, last[:, None], axis=1)
    return z >= threshold


def sample_rows(logits: jax.Array, counts: jax.Array, rows: SamplingRows, banned: jax.Array,
                positions: jax.Array) -> jax.Array:
    """int32 [B] tokens from float32 logits [B, V]; NONFINITE_TOKEN for non-finite rows.
    The sort/noise work is skipped (lax.cond) when every row is greedy."""
    logits = logits.astype(jnp.float32)
    x = logits - rows.presence[:, None] * (counts > 0) - rows.frequency[:, None] * counts
    x = jnp.where(banned, -jnp.inf, x)
    greedy = jnp.argmax(x, axis=1).astype(jnp.int32)

    def draw(_):
        temperature = jnp.where(rows.temperature > 0, rows.temperature, 1.0)
        z = x / temperature[:, None]
        keep = nucleus_mask(z, rows.top_k, rows.top_p)
        noisy = jnp.where(keep, z + gumbel_noise(rows.seed, positions, x.shape[1]), -jnp.inf)
        return jnp.where(rows.temperature > 0, jnp.argmax(noisy, axis=1).astype(jnp.int32), greedy)

    tokens = jax.lax.cond(jnp.any(rows.temperature > 0), draw, lambda _: greedy, None)
    return jnp.where(jnp.isfinite(logits).all(axis=1), tokens, NONFINITE_TOKEN)


def update_counts(counts: jax.Array, tokens: jax.Array, decay: jax.Array) -> jax.Array:
    """Penalty counts [B, V] after emitting tokens [B]: counts * decay + onehot(tokens)."""
    rows = jnp.arange(tokens.shape[0])
    return (counts * decay[:, None]).at[rows, tokens].add(1.0)
