"""The sampler's radix threshold search: the Pallas passes (interpret mode) find the same
threshold as the XLA passes in every form, on random rows with ties at the top, banned (-inf)
tokens, a flat row and limits that keep one token, some or all."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import radix_search


def random_rows(rng, B, V):
    z = (rng.standard_normal((B, V)) * rng.choice([0.5, 3.0, 8.0], (B, 1))).astype(np.float32)
    z[0, rng.choice(V, 3, replace=False)] = z[0].max() + 1.0   # a three-way tie for the top
    z[1, rng.choice(V, 40, replace=False)] = -np.inf            # banned tokens
    z[2] = z[2, 0]                                               # a flat row: every key ties
    return z


@pytest.mark.parametrize("mass", [False, True])
def test_pallas_passes_find_the_reference_threshold(mass):
    rng = np.random.default_rng()
    B, V = 4, 4096  # two blocks of keys
    z = random_rows(rng, B, V)
    keys = radix_search.signed_keys(jnp.asarray(z))
    if mass:
        weights = jnp.exp(jnp.asarray(z) - z.max(axis=1, keepdims=True))
        limit = np.array([rng.uniform(0.05, 0.95), rng.uniform(0.05, 0.95), 0.5, 1.0], np.float32)
    else:
        weights = None
        limit = np.array([1, rng.integers(2, 50), rng.integers(1, V), V], np.float32)
    want = radix_search.smallest_key_reference(keys, weights, jnp.asarray(limit), mass, unrolled=True)
    got = radix_search.smallest_key(keys, weights, jnp.asarray(limit), mass, interpret=True)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for bits in (1, 8):  # the one-bit loop and the eight-bit passes agree too
        form = radix_search.smallest_key_reference(keys, weights, jnp.asarray(limit), mass,
                                                   unrolled=bits == 8, bits=bits)
        np.testing.assert_array_equal(np.asarray(form), np.asarray(want))
    kept = (np.asarray(keys) >= np.asarray(got)[:, None]).sum(axis=1)
    assert kept[2] == V  # a flat row keeps every tied key
    if not mass:
        assert kept[0] == 3 and kept[3] == V  # ties at the threshold are kept; k = V keeps all


def test_signed_keys_order_like_the_floats():
    rng = np.random.default_rng()
    z = np.concatenate([rng.standard_normal(500).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 500),
                        np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45], np.float32)])
    keys = np.asarray(radix_search.signed_keys(jnp.asarray(z)[None]))[0]
    order = np.argsort(z, kind="stable")
    assert (np.diff(keys[order]) >= 0).all() and keys[-6] == keys[-5]  # 0.0 and -0.0 tie
    assert radix_search.supports(65536) and not radix_search.supports(50277) and not radix_search.supports(3 * 2048)
