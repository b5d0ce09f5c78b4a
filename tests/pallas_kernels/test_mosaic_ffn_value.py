"""The Mosaic GPU ffn_value (the dense value product) in GPU interpret mode (race detection on,
out-of-bounds reads raising) against the reference (``relu_square`` of the summed key partials
times the value weight) on fresh seeded inputs with many zero units: M = 1, 3 and 16 over
padded rows (written as zeros), 1 to 3 key splits, pipelines reusing their slots,
C = 192 (blocks of 64) and 40 (blocks of 8), float32, bfloat16 and float16 (the hidden units kept
float32). Needs jax >= 0.11."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.segment_linear import padded_rows
from pallas_kernels.small_m_linear import matmul_f32
from pallas_kernels.sparse_channel_mix import relu_square
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version

pytestmark = pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX,
                                reason="Mosaic GPU interpret mode needs jax >= 0.11")

if jax_version() >= MOSAIC_MIN_JAX:  # GPU interpret mode's modules exist from jax 0.11
    from pallas_kernels.mosaic import common as mosaic_common
    from pallas_kernels.mosaic import ffn_value as mosaic_ffn_value


@pytest.mark.parametrize("M,F,C,splits_in,splits,dtype", [
    (1, 2048, 192, 2, 1, jnp.bfloat16),  # 16 F tiles through fewer pipeline slots
    (3, 256, 40, 3, 1, jnp.float32),
    (16, 128, 64, 1, None, jnp.float16),
])
def test_mosaic_ffn_value_matches_reference(M, F, C, splits_in, splits, dtype):
    mosaic_common.reset_interpreter()
    k1, k2 = jax.random.split(jax.random.key(M * F + C))
    Mp_in = padded_rows(M)
    pre = jax.random.normal(k1, (splits_in, Mp_in, F)) - 0.3  # about two thirds of the units zero
    w_val_t = (jax.random.normal(k2, (F, C)) / math.sqrt(F)).astype(dtype)
    hidden = relu_square(pre.sum(0)[:M], dtype)
    want = matmul_f32(hidden, w_val_t, w_in_axis=0).astype(dtype)
    run = jax.jit(lambda p, w: mosaic_ffn_value.ffn_value(p, w, M=M, dtype=dtype, splits=splits, interpret=True))
    got = run(pre, w_val_t)
    assert not mosaic_common.races_found()
    assert got.shape[1:] == (padded_rows(M), C) and got.dtype == jnp.float32
    total = got.sum(0)
    np.testing.assert_array_equal(np.asarray(total[M:]), 0.0)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(total[:M].astype(dtype), np.float32), np.asarray(want, np.float32),
                               atol=tol, rtol=tol)


def test_mosaic_ffn_value_declines_what_the_triton_kernel_keeps():
    """The skipping (sparse) product, quantized value weights, more than MAX_M rows and F
    without a divisor of 64 go to the Triton kernel (``rwkv_jax.mosaic_ops``)."""
    w = jnp.zeros((512, 64), jnp.bfloat16)
    assert mosaic_ffn_value.supports(1, 512, 64, w)
    assert not mosaic_ffn_value.supports(1, 512, 64, w, skip=True)
    assert not mosaic_ffn_value.supports(1, 512, 64, QuantizedWeight(jnp.zeros((64, 512), jnp.int8),
                                                                      jnp.ones((64, 4), jnp.float32)))
    assert not mosaic_ffn_value.supports(mosaic_ffn_value.MAX_M + 1, 512, 64, w)
    assert not mosaic_ffn_value.supports(1, 96, 64, w)
