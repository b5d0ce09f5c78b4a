"""Each Pallas kernel in interpret mode against its plain-jnp reference (fresh seeded inputs).

Interpret mode fills every output buffer with NaN before the kernel runs (checked by
`test_interpret_mode_poisons_unwritten_outputs`), so an element a kernel forgets to write
fails the finiteness and closeness checks. Shapes include C=192 / H=3 and odd batch sizes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_kernels import shift_mix, small_m_linear, wkv_seq, wkv_step
from pallas_kernels.common import triton_params
from tests.support.pallas_inputs import wkv_inputs


def _keys(seed: int, n: int):
    return jax.random.split(jax.random.key(seed), n)


def _wkv_inputs(seed: int, lead: tuple[int, ...], H: int, N: int = 64):
    """((r, w, k, v, kk, a) [*lead, H, N], S [lead[0], H, N, N]): the GPU check's inputs."""
    *xs, S = wkv_inputs(seed, lead, H, N)
    return tuple(xs), S


def _assert_close(got, want, atol, rtol=1e-5):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "kernel left unwritten (NaN) or non-finite elements"
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


def test_interpret_mode_poisons_unwritten_outputs():
    """A kernel writing only the first half of its output leaves NaN in the second half."""
    def half_kernel(x_ref, o_ref):
        o_ref[pl.ds(0, 8)] = x_ref[pl.ds(0, 8)]

    x = jax.random.normal(jax.random.key(0), (16,))
    out = pl.pallas_call(half_kernel, out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
                         compiler_params=triton_params(), interpret=True)(x)
    np.testing.assert_array_equal(np.asarray(out[:8]), np.asarray(x[:8]))
    assert np.isnan(np.asarray(out[8:])).all()


@pytest.mark.parametrize("B,H", [(3, 3), (1, 2)])
def test_wkv_step_matches_reference(B, H):
    (r, w, k, v, kk, a), S = _wkv_inputs(10 + B, (B,), H)
    y, S_new = wkv_step.wkv_step(r, w, k, v, kk, a, S, interpret=True)
    y_ref, S_ref = wkv_step.wkv_step_reference(r, w, k, v, kk, a, S)
    _assert_close(y, y_ref, atol=1e-4)
    _assert_close(S_new, S_ref, atol=1e-5)


@pytest.mark.parametrize("state_dtype", [jnp.float32, jnp.bfloat16])
def test_wkv_step_on_a_layer_of_the_whole_leaf_steps_that_layer_only(state_dtype):
    L, layer = 3, int(np.random.default_rng().integers(3))
    (r, w, k, v, kk, a), S = _wkv_inputs(int(np.random.default_rng().integers(1 << 30)), (2,), 3)
    leaf = jnp.stack([S * (i + 1) for i in range(L)], axis=1).astype(state_dtype)  # [B, L, H, N, N]
    y, new = wkv_step.wkv_step(r, w, k, v, kk, a, leaf, layer=layer, interpret=True)
    y_ref, S_ref = wkv_step.wkv_step_reference(r, w, k, v, kk, a, leaf[:, layer])
    assert new.shape == leaf.shape and new.dtype == state_dtype
    _assert_close(y, y_ref, atol=1e-4)
    _assert_close(new[:, layer].astype(jnp.float32), S_ref.astype(jnp.float32), atol=1e-5)
    others = [i for i in range(L) if i != layer]
    np.testing.assert_array_equal(np.asarray(new[:, others]), np.asarray(leaf[:, others]))
    with pytest.raises(ValueError, match="with L > layer=3"):
        wkv_step.wkv_step(r, w, k, v, kk, a, leaf, layer=3, interpret=True)


def test_wkv_step_rejects_bad_shapes():
    (r, w, k, v, kk, a), S = _wkv_inputs(0, (2,), 2)
    with pytest.raises(ValueError, match="S must be float32"):
        wkv_step.wkv_step(r, w, k, v, kk, a, S[:, :, :32], interpret=True)
    with pytest.raises(ValueError, match="kk must be float32"):
        wkv_step.wkv_step(r, w, k, v, kk.astype(jnp.bfloat16), a, S, interpret=True)


@pytest.mark.parametrize("B,T,H", [(3, 19, 3), (1, 8, 2)])
def test_wkv_seq_matches_reference(B, T, H):
    (r, w, k, v, kk, a), S = _wkv_inputs(20 + T, (B, T), H)
    y, S_new = wkv_seq.wkv_seq(r, w, k, v, kk, a, S, interpret=True)
    y_ref, S_ref = wkv_seq.wkv_seq_reference(r, w, k, v, kk, a, S)
    _assert_close(y, y_ref, atol=1e-4)
    _assert_close(S_new, S_ref, atol=1e-4)


def test_wkv_seq_equals_repeated_steps():
    """The sequence kernel over T steps equals T calls of the step kernel."""
    (r, w, k, v, kk, a), S = _wkv_inputs(5, (2, 5), 3)
    y, S_seq = wkv_seq.wkv_seq(r, w, k, v, kk, a, S, interpret=True)
    S_step = S
    for t in range(5):
        y_t, S_step = wkv_step.wkv_step(*(x[:, t] for x in (r, w, k, v, kk, a)), S_step, interpret=True)
        _assert_close(y[:, t], y_t, atol=1e-5)
    _assert_close(S_seq, S_step, atol=1e-5)


@pytest.mark.parametrize("B,C,n,dtype,with_delta", [
    (5, 192, 6, jnp.float32, True), (3, 192, 1, jnp.float32, False),
    (1, 128, 6, jnp.bfloat16, True), (2, 256, 1, jnp.float16, True)])
def test_shift_mix_matches_reference(B, C, n, dtype, with_delta):
    ks = _keys(30 + B + C + n, 6)
    h, delta, shift = (jax.random.normal(ks[i], (B, C)).astype(dtype) for i in range(3))
    ln_w = 1 + 0.3 * jax.random.normal(ks[3], (C,))
    ln_b = 0.3 * jax.random.normal(ks[4], (C,))
    mix = jax.random.uniform(ks[5], (n, C)).astype(dtype)
    delta = delta if with_delta else None
    got = shift_mix.shift_mix(h, delta, shift, ln_w, ln_b, mix, interpret=True)
    want = shift_mix.shift_mix_reference(h, delta, shift, ln_w, ln_b, mix)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for g, w_ in zip(got, want):
        assert g.dtype == dtype
        _assert_close(g, w_, atol=tol, rtol=tol)


@pytest.mark.parametrize("M,N,K,dtype,splits", [
    (1, 320, 192, jnp.float32, 3), (1, 128, 512, jnp.bfloat16, None), (3, 192, 512, jnp.float32, 2),
    (16, 64, 256, jnp.float16, None), (5, 96, 96, jnp.bfloat16, 3)])
def test_small_m_linear_matches_reference(M, N, K, dtype, splits):
    ks = _keys(40 + M + N + K, 2)
    x = jax.random.normal(ks[0], (M, K)).astype(dtype)
    w = (jax.random.normal(ks[1], (N, K)) / np.sqrt(K)).astype(dtype)
    got = small_m_linear.small_m_linear(x, w, splits=splits, interpret=True)
    want = small_m_linear.linear_reference(x, w)
    assert got.dtype == dtype and got.shape == (M, N)
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    _assert_close(got, want, atol=tol, rtol=tol)


def test_small_m_linear_float32_output_and_errors():
    ks = _keys(50, 2)
    x = jax.random.normal(ks[0], (2, 64)).astype(jnp.bfloat16)
    w = jax.random.normal(ks[1], (32, 64)).astype(jnp.bfloat16)
    got = small_m_linear.small_m_linear(x, w, out_dtype=jnp.float32, interpret=True)
    assert got.dtype == jnp.float32
    _assert_close(got, small_m_linear.linear_reference(x, w, jnp.float32), atol=1e-4)
    with pytest.raises(ValueError, match="unsupported M=17"):
        small_m_linear.small_m_linear(jnp.zeros((17, 64)), jnp.zeros((32, 64)), interpret=True)
    with pytest.raises(ValueError, match="w must be"):
        small_m_linear.small_m_linear(jnp.zeros((1, 64)), jnp.zeros((32, 48)), interpret=True)
    assert not small_m_linear.supports(1, 64, 24)   # K without a power-of-two divisor >= 16
    assert not small_m_linear.supports(1, 300, 64)  # N likewise (blocks must tile N exactly)
