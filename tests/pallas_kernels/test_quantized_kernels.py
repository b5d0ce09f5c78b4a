"""The quantized decode kernels (int8 and int4 groups of 64 and 128, fp8) in interpret mode against their
plain-jnp references on fresh seeded inputs: quantized_linear, quantized_channel_mix, the
quantized segments of segment_linear, the quantized value weight of ffn_value, and the fused
time-mix and channel-mix on quantized weights. Interpret mode fills outputs with NaN first, so
an unwritten element fails."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import segment_linear
from pallas_kernels.fused_time_mix import fused_channel_mix, fused_time_mix
from pallas_kernels.quantized import QuantizedWeight, cpu_float32
from pallas_kernels.quantized_channel_mix import quantized_channel_mix, quantized_channel_mix_reference
from pallas_kernels.quantized_linear import quantized_linear, quantized_linear_reference
from pallas_kernels.small_m_linear import linear_reference
from pallas_kernels.time_mix import TimeMixWeights, time_mix_reference
from pallas_kernels.wkv_step import wkv_step_reference
from rwkv7_core.quantization import quantize, spec_for

SPECS = {"int8-64": spec_for("int8", 64), "int8-128": spec_for("int8", 128), "fp8": spec_for("fp8"),
         "int4-64": spec_for("int4", 64), "int4-128": spec_for("int4", 128)}
H, N = 2, 64
C, F = H * N, 4 * H * N


def _keys(seed, n):
    return iter(jax.random.split(jax.random.key(seed), n))


def _quantized(key, out: int, width: int, spec) -> QuantizedWeight:
    w = np.asarray(jax.random.normal(key, (out, width))) / math.sqrt(width)
    q, scale = quantize(w, spec)
    return QuantizedWeight(jnp.asarray(q), jnp.asarray(scale))


def _close(got, want, atol):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape and np.isfinite(got).all(), "unwritten (NaN) or non-finite elements"
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4)


def _same_sums(skipped, dense, scheme: str) -> None:
    """Skipping sums the same terms (the masked ones exact zeros): bit-identical for int8 / fp8;
    an int4 tile's two halves let XLA:CPU (interpret mode) order the sums differently, so to
    float32 rounding there."""
    if SPECS[scheme].scheme == "int4":
        np.testing.assert_allclose(np.asarray(skipped), np.asarray(dense), rtol=1e-6, atol=2e-7)
    else:
        np.testing.assert_array_equal(np.asarray(skipped), np.asarray(dense))


def _sparse_rows(key, M, K, dtype, zero=0.9):
    """relu²-like rows [M, K]: non-negative, `zero` of the columns zero in every row."""
    k1, k2 = jax.random.split(key)
    off = jax.random.uniform(k1, (K,)) < zero
    return jnp.where(off, 0.0, jnp.abs(jax.random.normal(k2, (M, K)))).astype(dtype)


@pytest.mark.parametrize("scheme", SPECS)
@pytest.mark.parametrize("M,dtype", [(1, jnp.float32), (8, jnp.float32), (8, jnp.bfloat16)])
def test_quantized_linear_matches_reference(scheme, M, dtype):
    ks = _keys(M, 2)
    w = _quantized(next(ks), 64, 256, SPECS[scheme])
    x = jax.random.normal(next(ks), (M, 256)).astype(dtype)
    got = quantized_linear(x, w, out_dtype=jnp.float32, interpret=True)
    _close(got, quantized_linear_reference(x, w, jnp.float32), 2e-5 if dtype == jnp.float32 else 2e-3)


@pytest.mark.parametrize("M,scheme", [(1, "int8-64"), (8, "fp8"), (1, "int4-64"), (8, "int4-128")])
def test_quantized_linear_skipping_zero_columns_is_exact(M, scheme):
    ks = _keys(10 + M, 2)
    w = _quantized(next(ks), 64, 512, SPECS[scheme])
    x = _sparse_rows(next(ks), M, 512, jnp.float32)
    skipped = quantized_linear(x, w, out_dtype=jnp.float32, skip=True, interpret=True)
    dense = quantized_linear(x, w, out_dtype=jnp.float32, skip=False, interpret=True)
    _same_sums(skipped, dense, scheme)
    _close(skipped, quantized_linear_reference(x, w, jnp.float32), 2e-5)


@pytest.mark.parametrize("M,scheme", [(1, "int8-128"), (8, "int8-64"), (1, "fp8"), (1, "int4-128"), (8, "int4-64")])
def test_quantized_channel_mix_matches_reference(M, scheme):
    ks = _keys(20 + M, 3)
    xk = jax.random.normal(next(ks), (M, C))
    w_key, w_val = _quantized(next(ks), F, C, SPECS[scheme]), _quantized(next(ks), C, F, SPECS[scheme])
    got = quantized_channel_mix(xk, w_key, w_val, skip=True, interpret=True)
    _close(got, quantized_channel_mix_reference(xk, w_key, w_val), 1e-4)


def test_cpu_widening_is_exact_for_every_code():
    """cpu_float32 (the XLA:CPU product's convert) equals the plain convert on every int8 and
    every finite float8_e4m3fn code, signed zeros and subnormals included."""
    codes = np.arange(256, dtype=np.uint8)
    for dtype, keep in ((jnp.int8, codes == codes), (jnp.float8_e4m3fn, (codes & 0x7F) != 0x7F)):
        q = jax.lax.bitcast_convert_type(jnp.asarray(codes[keep]), dtype)
        got, want = np.asarray(jax.jit(cpu_float32)(q)), np.asarray(q.astype(jnp.float32))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_quantized_kernels_reject_bad_shapes():
    w = _quantized(jax.random.key(0), 64, 256, SPECS["int8-64"])
    with pytest.raises(ValueError, match="unsupported M=17"):
        quantized_linear(jnp.zeros((17, 256)), w, interpret=True)
    with pytest.raises(ValueError, match="w must be \\[N, K\\] with K=128"):
        quantized_linear(jnp.zeros((1, 128)), w, interpret=True)
    with pytest.raises(ValueError, match="need key \\[F, C=256\\] and value \\[C, F\\]"):
        quantized_channel_mix(jnp.zeros((1, 256)), w, w, interpret=True)


@pytest.mark.parametrize("M,scheme", [(1, "int8-64"), (8, "fp8"), (1, "int4-64"), (8, "int4-128")])
def test_segment_linear_with_quantized_segments_matches_reference(M, scheme):
    """Quantized segments beside a plain one in one launch (the r/k/v and LoRA downs)."""
    ks = _keys(30 + M, 4)
    xs = jax.random.normal(next(ks), (3, M, C))
    weights = [_quantized(next(ks), C, C, SPECS[scheme]), (jax.random.normal(next(ks), (32, C)) / math.sqrt(C)),
               _quantized(next(ks), 64, C, SPECS[scheme])]
    inputs = [0, 2, 1]
    partials = segment_linear.segment_linear(xs, weights, inputs, interpret=True)
    got = partials.sum(0)[:M]
    want = jnp.concatenate([quantized_linear_reference(xs[j], w, jnp.float32) if isinstance(w, QuantizedWeight)
                            else linear_reference(xs[j], w, jnp.float32) for w, j in zip(weights, inputs)], axis=1)
    _close(got, want, 2e-5)


@pytest.mark.parametrize("M,scheme", [(1, "int8-128"), (8, "int8-64"), (1, "fp8"), (1, "int4-64"), (8, "int4-128")])
def test_fused_channel_mix_on_quantized_weights(M, scheme):
    """The key product and ffn_value on quantized weights (value [C, F]), skipping exact."""
    ks = _keys(40 + M, 4)
    xk = jnp.abs(jax.random.normal(next(ks), (M, C)))
    w_key = _quantized(next(ks), F, C, SPECS[scheme])
    flip = jax.random.uniform(next(ks), (F, 1)) < 0.5  # rows with a negative scale: zero activations to skip
    w_key = w_key._replace(scale=jnp.where(flip, -w_key.scale, w_key.scale))
    w_val = _quantized(next(ks), C, F, SPECS[scheme])
    skipped = fused_channel_mix(xk, w_key, w_val, skip=True, interpret=True)
    dense = fused_channel_mix(xk, w_key, w_val, skip=False, interpret=True)
    _same_sums(skipped.partials, dense.partials, scheme)
    _close(skipped.total(), quantized_channel_mix_reference(xk, w_key, w_val), 1e-4)


@pytest.mark.parametrize("B,first,scheme", [(1, False, "int8-64"), (1, False, "int4-64"), (2, True, "int4-128")])
def test_fused_time_mix_on_quantized_weights(B, first, scheme):
    ks = _keys(50 + B, 30)
    spec = SPECS[scheme]
    mat = lambda o, i: jax.random.normal(next(ks), (o, i)) / math.sqrt(i)  # noqa: E731
    vecs = (jnp.stack([jax.random.normal(next(ks), (C,)) for _ in range(7)]) * 0.5).at[5].add(1.0)
    wts = TimeMixWeights(*(_quantized(next(ks), C, C, spec) for _ in range(4)), mat(32, C), mat(C, 32), mat(16, C),
                         mat(C, 16), mat(16, C), mat(C, 16), mat(48, C), mat(C, 48), vecs,
                         0.5 * jax.random.normal(next(ks), (H, N)))
    mixed = jax.random.normal(next(ks), (6, B, C))
    v_first = None if first else jax.random.normal(next(ks), (B, C))
    S = 0.1 * jax.random.normal(next(ks), (B, H, N, N))

    def linear(x, w):
        if isinstance(w, QuantizedWeight):
            return quantized_linear_reference(x, w)
        return linear_reference(x, w)

    want, S_want, vf_want = time_mix_reference(mixed, wts, S, v_first, first=first, linear=linear,
                                               wkv=lambda S, *xs: wkv_step_reference(*xs, S))
    got, S_got, vf_got = fused_time_mix(mixed, wts, S, v_first, first=first, interpret=True)
    _close(got.total(), want, 2e-4)
    _close(S_got, S_want, 1e-5)
    _close(vf_got, vf_want, 1e-5)
