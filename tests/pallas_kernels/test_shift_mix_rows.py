"""The fused prefill shift-mix kernel equals its reference and the per-sequence token shift
(interpret mode), on random varlen batches with length-1 and empty sequences."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.shift_mix import add_layer_norm
from pallas_kernels.shift_mix_rows import dense_links, row_links, shift_mix_rows, shift_mix_rows_reference


def _inputs(rng, M, P, C, n, dtype, with_delta):
    def f(*s):
        return jnp.asarray(rng.standard_normal(s), jnp.float32)

    h, delta, shift = f(M, C).astype(dtype), f(M, C).astype(dtype) if with_delta else None, f(P, C).astype(dtype)
    return h, delta, shift, 1 + 0.1 * f(C), 0.1 * f(C), jnp.asarray(rng.uniform(size=(n, C)), dtype)


@pytest.mark.parametrize("lengths,pad,C,dtype,with_delta", [
    ([1, 5, 0, 1, 9], 3, 96, jnp.float32, True),
    ([3, 1, 1, 12], 0, 64, jnp.bfloat16, False),
])
def test_shift_mix_rows_matches_reference_and_per_sequence_shift(lengths, pad, C, dtype, with_delta):
    rng = np.random.default_rng(len(lengths) + C)
    M, P = sum(lengths) + pad, len(lengths)
    h, delta, shift, ln_w, ln_b, mix = _inputs(rng, M, P, C, 3, dtype, with_delta)
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    links = row_links(cu, M)
    got = shift_mix_rows(h, delta, shift, ln_w, ln_b, mix, links, interpret=True)
    want = shift_mix_rows_reference(h, delta, shift, ln_w, ln_b, mix, links)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g[:sum(lengths)] if g.shape[0] == M else g, np.float32),
                                   np.asarray(w[:sum(lengths)] if w.shape[0] == M else w, np.float32), atol=tol, rtol=tol)
    # each sequence alone: prev is the carried shift, then the previous token; new shift = last x
    _, x = add_layer_norm(h, delta, ln_w, ln_b)
    pos = 0
    for p, n in enumerate(lengths):
        for t in range(pos, pos + n):
            prev = shift[p] if t == pos else x[t - 1]
            mixed0 = (x[t].astype(jnp.float32) + (prev.astype(jnp.float32) - x[t].astype(jnp.float32))
                      * mix[0].astype(jnp.float32)).astype(dtype)
            np.testing.assert_allclose(np.asarray(got[1][0][t], np.float32), np.asarray(mixed0, np.float32),
                                       atol=tol, rtol=tol)
        np.testing.assert_allclose(np.asarray(got[2][p], np.float32),
                                   np.asarray(x[pos + n - 1] if n else shift[p], np.float32), atol=tol, rtol=tol)
        pos += n
    # reading the rows of one layer of a whole [P, L, C] state leaf in place gives the same
    leaf = jnp.stack([shift * 0 + 7, shift], axis=1)
    in_place = shift_mix_rows(h, delta, leaf, ln_w, ln_b, mix, links, layer=1, interpret=True)
    for g, w in zip(jax.tree.leaves(in_place), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_dense_links_equal_row_links_of_equal_lengths():
    B, T = 3, 5
    cu = jnp.arange(0, B * T + 1, T, dtype=jnp.int32)
    np.testing.assert_array_equal(dense_links(B, T), np.asarray(row_links(cu, B * T)))
