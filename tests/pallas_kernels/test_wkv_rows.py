"""The prefill's row kernels around the chunked wkv kernel (interpret mode) against the jnp
references they replace: the wkv operands from the time-mix products (first layer and later
ones) and GroupNorm + bonus + gate, on a row count that is no multiple of the row block (the
last block moved back) and one smaller than a block."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.time_mix import wkv_operands_reference, wkv_output_reference
from pallas_kernels.wkv_operands import BLOCK_ROWS, wkv_operands
from pallas_kernels.wkv_output import wkv_output
from tests.support.pallas_inputs import wkv_products

H, N = 2, 64
C = H * N


@pytest.mark.parametrize("M, first", [(BLOCK_ROWS + 5, False), (BLOCK_ROWS + 5, True), (3, False)])
def test_operands_kernel_matches_the_reference(M, first):
    r, k, v, w_l, a_l, v_l, vecs, v_first = wkv_products(M + first, M, C)
    if first:
        v_l = v_first = None
    got = wkv_operands(r, k, v, w_l, a_l, v_l, vecs, v_first, n_head=H, interpret=True)
    want = wkv_operands_reference(r, k, v, w_l, a_l, v_l, vecs, v_first, n_head=H)
    for name, x, y in zip(("r", "w", "k", "v", "kk", "a", "v_first"), got, want):
        assert x.shape == (M, C) and x.dtype == jnp.float32, name
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_output_kernel_matches_the_reference(dtype):
    M = BLOCK_ROWS + 5
    r, k, v, g, *_ = wkv_products(9, M, C, dtype)
    _, _, _, _, _, _, vecs, _ = wkv_products(10, M, C)
    y = 3 * jax.random.normal(jax.random.key(11), (M, H, N)) + 1
    r_k = jax.random.normal(jax.random.key(12), (H, N))
    r, k, v = (x.astype(jnp.float32) for x in (r, k, v))
    got = wkv_output(y, r, k, v, g, vecs, r_k, dtype, interpret=True)
    want = wkv_output_reference(y, r, k, v, g, vecs, r_k, dtype)
    assert got.shape == (M, C) and got.dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


def test_a_head_size_the_kernels_cannot_serve_is_named():
    rows, vecs = jnp.zeros((4, 96)), jnp.zeros((7, 96))
    with pytest.raises(ValueError, match="power-of-two head size"):
        wkv_operands(*[rows] * 6, vecs, rows, n_head=2, interpret=True)
