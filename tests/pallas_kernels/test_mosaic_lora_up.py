"""The Mosaic GPU lora_up in GPU interpret mode (race detection on, out-of-bounds reads raising)
against ``lora_up_reference`` on fresh seeded split-K partials: the three (first layer) and four
pairs with every activation, LoRA widths 16, 32, 64, 96 (a piece of 64 and a remainder) and 256,
C = 128 and 192 (two and three programs), M = 1, 3 and 16 over padded rows (written as zeros),
1 and 3 splits, float32 and bfloat16. Needs jax >= 0.11."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.small_m_linear import linear_reference
from pallas_kernels.time_mix import lora_up_reference
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version

pytestmark = pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX,
                                reason="Mosaic GPU interpret mode needs jax >= 0.11")

if jax_version() >= MOSAIC_MIN_JAX:  # GPU interpret mode's modules exist from jax 0.11
    from pallas_kernels.mosaic import common as mosaic_common
    from pallas_kernels.mosaic import lora_up as mosaic_lora_up


@pytest.mark.parametrize("M,Mp,C,widths,kinds,splits,dtype", [
    (1, 1, 128, [32, 64, 32, 96], "wavg", 1, jnp.float32),
    (3, 16, 192, [32, 16, 256], "wag", 3, jnp.bfloat16),
    (16, 16, 128, [16, 16, 16, 32], "wavg", 2, jnp.float32),
])
def test_mosaic_lora_up_matches_reference(M, Mp, C, widths, kinds, splits, dtype):
    mosaic_common.reset_interpreter()
    ks = iter(jax.random.split(jax.random.key(M * C + len(widths)), 2 + len(widths)))
    lead = 40  # the r/k/v columns before the down products (not read)
    offsets = [lead + sum(widths[:i]) for i in range(len(widths))]
    partials = jax.random.normal(next(ks), (splits, Mp, lead + sum(widths) + 8)) / math.sqrt(splits)
    ups = [(jax.random.normal(next(ks), (C, d)) / math.sqrt(d)).astype(dtype) for d in widths]
    hidden = [partials.sum(0)[:M, o:o + d].astype(dtype) for o, d in zip(offsets, widths)]
    want = lora_up_reference(hidden, ups, kinds, linear_reference)
    run = jax.jit(lambda p, *u: mosaic_lora_up.lora_up(p, list(u), offsets, kinds, M=M, dtype=dtype, interpret=True))
    got = run(partials, *ups)
    assert not mosaic_common.races_found()
    assert got.shape == (len(widths), Mp, C) and got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got[:, M:], np.float32), 0.0)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for i, w in enumerate(want):
        np.testing.assert_allclose(np.asarray(got[i, :M], np.float32), np.asarray(w, np.float32), atol=tol, rtol=tol)


def test_mosaic_lora_up_declines_what_the_triton_kernel_keeps():
    """More than MAX_M rows, widths not a multiple of 8 or past TMA's box, partials copies not a
    whole multiple of 128 bytes, C not a multiple of 64, or buffers past the shared-memory limit go to the Triton kernel (``rwkv_jax.mosaic_ops``)."""
    f32 = jnp.float32
    assert mosaic_lora_up.supports(16, 4, 16, 2048, [96, 96, 64, 256], jnp.bfloat16)
    assert not mosaic_lora_up.supports(17, 1, 32, 2048, [96], f32)
    assert not mosaic_lora_up.supports(1, 1, 1, 2048, [12], f32)
    assert not mosaic_lora_up.supports(1, 1, 1, 2048, [320], f32)
    assert not mosaic_lora_up.supports(1, 1, 1, 160, [32], f32)
    assert not mosaic_lora_up.supports(16, 8, 16, 2048, [256, 256, 256, 256], f32)
    assert not mosaic_lora_up.supports(1, 1, 1, 2048, [16], f32)  # 64 bytes of partials: not a TMA copy
    assert mosaic_lora_up.supports(1, 2, 16, 2048, [16], f32)
