"""The XLA ops of the kernel-op contract against plain-numpy statements of the spec,
plus select_path's thresholds."""
import jax.numpy as jnp
import numpy as np
import pytest

from rwkv_jax.kernels import ops_for
from rwkv_jax.ops import XLA_OPS
from rwkv_jax.paths import MAX_DECODE_BATCH, Path, select_path


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _wkv_inputs(rng, B, T, H, N):
    r, k, v = (_rand(rng, B, T, H, N) for _ in range(3))
    w = np.exp(-0.606531 / (1 + np.exp(-_rand(rng, B, T, H, N)))).astype(np.float32)
    kk = _rand(rng, B, T, H, N)
    kk /= np.linalg.norm(kk, axis=-1, keepdims=True)
    a = (1 / (1 + np.exp(-_rand(rng, B, T, H, N)))).astype(np.float32)
    return r, w, k, v, kk, a, _rand(rng, B, H, N, N)


def _numpy_wkv(r, w, k, v, kk, a, S):
    S = S.astype(np.float64).copy()
    B, T, H, N = r.shape
    ys = np.zeros((B, T, H, N))
    for b in range(B):
        for t in range(T):
            for h in range(H):
                s = S[b, h]
                s = (s * w[b, t, h][None, :] + (s @ -kk[b, t, h])[:, None] * (kk[b, t, h] * a[b, t, h])[None, :]
                     + v[b, t, h][:, None] * k[b, t, h][None, :])
                S[b, h] = s
                ys[b, t, h] = s @ r[b, t, h]
    return ys, S


def test_wkv_seq_and_step_match_numpy_recurrence():
    rng = np.random.default_rng(0)
    inputs = _wkv_inputs(rng, 2, 5, 3, 8)
    y_ref, S_ref = _numpy_wkv(*inputs)
    y, S = XLA_OPS.wkv_seq(*inputs)
    np.testing.assert_allclose(np.asarray(y), y_ref, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(S), S_ref, atol=1e-4, rtol=1e-4)
    y1, S1 = XLA_OPS.wkv_step(*(x[:, 0] for x in inputs[:6]), inputs[6])
    np.testing.assert_allclose(np.asarray(y1), y_ref[:, 0], atol=1e-4, rtol=1e-4)


def test_linear_shift_mix_channel_mix_match_numpy():
    rng = np.random.default_rng(1)
    B, C, F = 3, 16, 24
    x, w = _rand(rng, B, C), _rand(rng, F, C)
    np.testing.assert_allclose(np.asarray(XLA_OPS.linear(x, w)), x @ w.T, atol=1e-4, rtol=1e-4)

    h, delta, shift = _rand(rng, B, C), _rand(rng, B, C), _rand(rng, B, C)
    ln_w, ln_b, mix = _rand(rng, C), _rand(rng, C), _rand(rng, 6, C)
    h_out, mixed, x_ln = XLA_OPS.shift_mix(h, delta, shift, ln_w, ln_b, mix)
    hs = h + delta
    ln = (hs - hs.mean(-1, keepdims=True)) / np.sqrt(hs.var(-1, keepdims=True) + 1e-5) * ln_w + ln_b
    np.testing.assert_allclose(np.asarray(h_out), hs, atol=1e-6)
    np.testing.assert_allclose(np.asarray(x_ln), ln, atol=1e-4)
    np.testing.assert_allclose(np.asarray(mixed), ln[None] + (shift - ln)[None] * mix[:, None], atol=1e-4)
    h_same, _, _ = XLA_OPS.shift_mix(h, None, shift, ln_w, ln_b, mix[:1])
    np.testing.assert_array_equal(np.asarray(h_same), h)

    wk, wv_t = _rand(rng, F, C), _rand(rng, F, C)
    ref = np.maximum(x @ wk.T, 0) ** 2 @ wv_t
    np.testing.assert_allclose(np.asarray(XLA_OPS.channel_mix(x, wk, wv_t)), ref, atol=1e-3, rtol=1e-4)


def test_select_path_thresholds():
    assert select_path(1, 1) is Path.B1T1
    assert select_path(2, 1) is Path.BATCHED_DECODE
    assert select_path(MAX_DECODE_BATCH, 1) is Path.BATCHED_DECODE
    assert select_path(MAX_DECODE_BATCH + 1, 1) is Path.DENSE
    assert select_path(1, 2) is Path.DENSE and select_path(8, 64) is Path.DENSE
    with pytest.raises(ValueError, match="B >= 1"):
        select_path(0, 1)


def test_ops_for_rejects_unknown_kernels_and_paths():
    assert ops_for(Path.DENSE, "xla") is XLA_OPS
    with pytest.raises(ValueError, match="unknown kernels"):
        ops_for(Path.DENSE, "cuda")
    with pytest.raises(ValueError, match="rwkv_jax.Path"):
        ops_for("dense", "xla")


def test_float16_channel_mix_survives_large_pre_activations():
    """relu(pre)**2 passes float16's 65504 once pre > ~256: it must stay float32 until the
    value product (as the torch reference does), giving finite float16 outputs."""
    rng = np.random.default_rng(2)
    C, F = 16, 32
    x = jnp.asarray(rng.uniform(-1, 1, (2, C)), jnp.float16)
    wk = jnp.asarray(rng.uniform(-1, 1, (F, C)) * 120.0, jnp.float16)  # pre-activations ~ hundreds
    wv_t = jnp.asarray(rng.standard_normal((F, C)) * 1e-3, jnp.float16)
    pre = np.asarray(x, np.float32) @ np.asarray(wk, np.float32).T
    assert pre.max() > 300.0
    ref = np.maximum(pre, 0) ** 2 @ np.asarray(wv_t, np.float32)
    got = np.asarray(XLA_OPS.channel_mix(x, wk, wv_t), np.float32)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2 * np.abs(ref).max())
