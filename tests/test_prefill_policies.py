"""Prefill policies: the varlen (flattened, offsets-based) pieces equal per-sequence runs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rwkv_jax.varlen import (segments_from_lengths, token_shift_varlen, wkv_varlen,
                             wkv_varlen_reference)


def spec_wkv_step(r, w, k, v, kk, a, S):
    """The spec's recurrence, written out: operands [B, H, N], S [B, H, N, N] (i=value, j=key)."""
    S = (S * w[..., None, :]
         + jnp.einsum("bhij,bhj->bhi", S, -kk)[..., :, None] * (kk * a)[..., None, :]
         + v[..., :, None] * k[..., None, :])
    return jnp.einsum("bhij,bhj->bhi", S, r), S


def _wkv_operands(rng, n_tokens, H, N):
    f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    kk = f(n_tokens, H, N)
    kk = kk / jnp.linalg.norm(kk, axis=-1, keepdims=True)
    w = jnp.asarray(rng.uniform(0.545, 1.0, (n_tokens, H, N)), jnp.float32)
    a = jnp.asarray(rng.uniform(0.0, 1.0, (n_tokens, H, N)), jnp.float32)
    return f(n_tokens, H, N), w, f(n_tokens, H, N) * 0.3, f(n_tokens, H, N), kk, a


# Empty sequences next to each other, at the front and the back, length-1 sequences,
# and padding tokens after the last sequence.
LENGTHS = [
    ([0, 3, 0, 0, 1, 5, 1, 0, 7, 0], 2),
    ([1, 1, 0, 1, 4, 0, 6], 0),
    ([1], 0),
]


@pytest.mark.parametrize("lengths,pad", LENGTHS)
@pytest.mark.parametrize("n_single_from_front", [False, True])
def test_wkv_varlen_equals_per_sequence(lengths, pad, n_single_from_front):
    rng = np.random.default_rng(sum(lengths) * 7 + pad)
    H, N = 2, 8
    n_tokens = sum(lengths) + pad
    ops = _wkv_operands(rng, n_tokens, H, N)
    state0 = jnp.asarray(rng.standard_normal((len(lengths), H, N, N)), jnp.float32)
    n_single = 0
    if n_single_from_front:
        while n_single < len(lengths) and lengths[n_single] <= 1:
            n_single += 1
    segs = segments_from_lengths(lengths)
    y, finals = jax.jit(wkv_varlen, static_argnames=("wkv_step", "n_single"))(
        *ops, state0, segs, wkv_step=spec_wkv_step, n_single=n_single)
    y_ref, finals_ref = wkv_varlen_reference(*ops, state0, lengths, wkv_step=spec_wkv_step)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(finals), np.asarray(finals_ref), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(y)[sum(lengths):] == 0)
    empty = [p for p, n in enumerate(lengths) if n == 0]
    np.testing.assert_array_equal(np.asarray(finals)[empty], np.asarray(state0)[empty])


@pytest.mark.parametrize("lengths,pad", LENGTHS)
def test_token_shift_varlen_resets_at_each_start(lengths, pad):
    rng = np.random.default_rng(len(lengths) + pad)
    C = 5
    n_tokens = sum(lengths) + pad
    x = jnp.asarray(rng.standard_normal((n_tokens, C)), jnp.float32)
    shift0 = jnp.asarray(rng.standard_normal((len(lengths), C)), jnp.float32)
    prev, new_shift = jax.jit(token_shift_varlen)(x, shift0, segments_from_lengths(lengths))
    pos = 0
    for p, n in enumerate(lengths):
        expect_prev = np.concatenate([np.asarray(shift0[p:p + 1]), np.asarray(x[pos:pos + n])])
        np.testing.assert_array_equal(np.asarray(prev[pos:pos + n]), expect_prev[:n])
        np.testing.assert_array_equal(np.asarray(new_shift[p]), expect_prev[n])
        pos += n


def test_segments_from_lengths_rejects_bad_input():
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        segments_from_lengths([3, -1])
    with pytest.raises(ValueError, match="n_seqs"):
        segments_from_lengths([1, 2, 3], n_seqs=2)
    segs = segments_from_lengths([2, 0, 3], n_seqs=5)
    assert segs.starts.tolist() == [0, 2, 2, 5, 5] and segs.lengths.tolist() == [2, 0, 3, 0, 0]


def test_plan_pieces_fills_budget_first_come_first_served():
    from scheduler.prefill_policies import plan_pieces
    assert plan_pieces([5, 300, 7], budget=256) == [5, 251]
    assert plan_pieces([5, 3, 7], budget=256) == [5, 3, 7]
    assert plan_pieces([5, 3, 7], budget=8) == [5, 3]
    assert plan_pieces([1000], budget=256) == [256]
    assert plan_pieces([1, 1, 1, 1], budget=256, max_pieces=3) == [1, 1, 1]
    assert plan_pieces([], budget=256) == []
    rng = np.random.default_rng(0)
    for _ in range(50):
        remaining = rng.integers(1, 100, rng.integers(1, 12)).tolist()
        budget, cap = int(rng.integers(1, 300)), int(rng.integers(1, 6))
        counts = plan_pieces(remaining, budget, cap)
        assert len(counts) <= cap and sum(counts) <= budget
        assert all(c == n for c, n in zip(counts[:-1], remaining))   # only the last is cut
        assert sum(counts) == min(budget, sum(remaining[:cap]))
    with pytest.raises(ValueError, match="budget"):
        plan_pieces([3], budget=0)
    with pytest.raises(ValueError, match="tokens left"):
        plan_pieces([0, 3], budget=4)


def test_varlen_shape_rounds_to_powers_of_two():
    from scheduler.prefill_policies import varlen_shape
    assert [varlen_shape(n) for n in (1, 16, 17, 256, 257)] == [16, 16, 32, 256, 512]
    with pytest.raises(ValueError):
        varlen_shape(0)
