"""Sparse channel-mix: equal to the dense relu^2 product, and skipping exact zeros changes nothing."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import sparse_channel_mix as scm


def _hidden_with_zeros(seed: int, M: int, F: int, zero_fraction: float):
    """relu^2-like activations [M, F] float32: non-negative, with ~zero_fraction exact zeros
    (whole units are zero in every row, as the union over rows is what the kernel skips)."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    values = jnp.square(jax.random.normal(k1, (M, F)))
    keep = jax.random.uniform(k2, (F,)) >= zero_fraction
    return jnp.where(keep[None, :], values, 0.0)


@pytest.mark.parametrize("zero_fraction,M", [(0.5, 1), (0.95, 3)])
def test_sparse_value_product_matches_dense_and_is_bitwise_skip_invariant(zero_fraction, M):
    F, C = 768, 192
    hidden = _hidden_with_zeros(int(zero_fraction * 100) + M, M, F, zero_fraction)
    measured = 1 - float(jnp.mean(jnp.any(hidden != 0, axis=0)))
    assert abs(measured - zero_fraction) < 0.06
    w_val_t = jax.random.normal(jax.random.key(7), (F, C))
    sparse = np.asarray(scm.sparse_value_product(hidden, w_val_t, interpret=True))
    full = np.asarray(scm.sparse_value_product(hidden, w_val_t, skip=False, interpret=True))
    dense = np.asarray(jnp.dot(hidden, w_val_t, precision=jax.lax.Precision.HIGHEST))
    assert np.isfinite(sparse).all()
    rel = np.abs(sparse - dense).max() / np.abs(dense).max()
    assert rel <= 1e-6, rel
    np.testing.assert_array_equal(sparse.view(np.uint32), full.view(np.uint32))


def test_active_lists_compact_in_order():
    hidden = jnp.array([[0.0, 2.0, 0.0, 3.0, 1.0, 0.0, 0.0, 0.0],
                        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0]])
    units, counts = scm.active_lists(hidden, splits=2)
    np.testing.assert_array_equal(np.asarray(counts), [2, 2])
    np.testing.assert_array_equal(np.asarray(units)[0, :2], [1, 3])
    np.testing.assert_array_equal(np.asarray(units)[1, :2], [4, 6])
    units, counts = scm.active_lists(hidden, splits=2, skip=False)
    np.testing.assert_array_equal(np.asarray(units), [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_array_equal(np.asarray(counts), [4, 4])


@pytest.mark.parametrize("splits", [1, 4, 16])
def test_active_lists_match_numpys_nonzero_on_random_sparsity(splits):
    rng = np.random.default_rng()
    M, F = 3, 256
    hidden = rng.standard_normal((M, F)) * (rng.random((M, F)) < rng.uniform(0.0, 0.3))
    hidden[:, rng.choice(F, 8, replace=False)] = 0.0
    units, counts = (np.asarray(x) for x in scm.active_lists(jnp.asarray(hidden, jnp.float32), splits=splits))
    per = F // splits
    for s in range(splits):
        want = s * per + np.flatnonzero((hidden[:, s * per:(s + 1) * per] != 0).any(axis=0))
        assert counts[s] == len(want)
        np.testing.assert_array_equal(units[s, :len(want)], want)
        assert (units[s, len(want):] == s * per).all()  # padded with the split's first unit


@pytest.mark.parametrize("M,dtype", [(1, jnp.float32), (2, jnp.bfloat16)])
def test_sparse_channel_mix_matches_reference(M, dtype):
    C, F = 192, 768
    ks = jax.random.split(jax.random.key(60 + M), 3)
    xk = jax.random.normal(ks[0], (M, C)).astype(dtype)
    w_key = (jax.random.normal(ks[1], (F, C)) / np.sqrt(C)).astype(dtype)
    w_val_t = (jax.random.normal(ks[2], (F, C)) / np.sqrt(F)).astype(dtype)
    got = scm.sparse_channel_mix(xk, w_key, w_val_t, interpret=True)
    want = scm.channel_mix_reference(xk, w_key, w_val_t)
    assert got.dtype == dtype and got.shape == (M, C)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    assert np.isfinite(np.asarray(got, np.float32)).all()
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol)


def test_sparse_value_product_rejects_bad_shapes():
    with pytest.raises(ValueError, match="w_val_t must be"):
        scm.sparse_value_product(jnp.zeros((1, 64)), jnp.zeros((32, 64)), interpret=True)
    with pytest.raises(ValueError, match="unsupported M=17"):
        scm.sparse_value_product(jnp.zeros((17, 64)), jnp.zeros((64, 32)), interpret=True)
