"""The Mosaic GPU segment_linear in GPU interpret mode (race detection on, out-of-bounds reads
raising) against ``segment_linear_reference`` on fresh seeded inputs: one segment and several
reading different inputs, widths sharing only a divisor of 16 or 32 (LoRA downs), 1 to 3 K splits,
deep pipelines (more K tiles than stages), M = 1, 3 (padded rows written as zeros) and 16
(the narrowed tiles); float32 (exact: no TF32), bfloat16, float16. Needs jax >= 0.11."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.segment_linear import padded_rows, segment_linear_reference
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version

pytestmark = pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX,
                                reason="Mosaic GPU interpret mode needs jax >= 0.11")

if jax_version() >= MOSAIC_MIN_JAX:  # GPU interpret mode's modules exist from jax 0.11
    from pallas_kernels.mosaic import common as mosaic_common
    from pallas_kernels.mosaic import segment_linear as mosaic_segment_linear


def _inputs(seed: int, M: int, K: int, Ns, n_in: int, dtype):
    ks = jax.random.split(jax.random.key(seed), len(Ns) + 1)
    xs = jax.random.normal(ks[0], (n_in, M, K)).astype(dtype)
    return xs, [(jax.random.normal(k, (n, K)) / np.sqrt(K)).astype(dtype) for k, n in zip(ks[1:], Ns)]


@pytest.mark.parametrize("M,K,Ns,inputs,splits,dtype", [
    (1, 128, [32, 64], [0, 1], None, jnp.float32),
    (3, 512, [64, 32, 16, 48], [2, 0, 1, 1], 2, jnp.bfloat16),
    (1, 2048, [128], [0], 1, jnp.float16),  # 16 K tiles through 6 pipeline slots
    (16, 256, [64, 32], [0, 0], 2, jnp.float32),
])
def test_mosaic_segment_linear_matches_reference(M, K, Ns, inputs, splits, dtype):
    mosaic_common.reset_interpreter()
    xs, ws = _inputs(M * K + len(Ns), M, K, Ns, max(inputs) + 1, dtype)
    want = jnp.concatenate(segment_linear_reference(xs, ws, inputs), axis=1)
    run = jax.jit(lambda xs, *ws: mosaic_segment_linear.segment_linear(xs, list(ws), inputs, splits=splits,
                                                                       interpret=True))
    partials = run(xs, *ws)
    assert not mosaic_common.races_found()
    assert partials.shape[1:] == (padded_rows(M), sum(Ns)) and partials.dtype == jnp.float32
    if splits:
        assert partials.shape[0] == splits
    total = partials.sum(0)
    np.testing.assert_array_equal(np.asarray(total[M:]), 0.0)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.asarray(total[:M].astype(dtype), np.float32), np.asarray(want, np.float32),
                               atol=tol, rtol=tol)


def test_mosaic_segment_linear_declines_what_the_triton_kernel_keeps():
    """Quantized weights, more than MAX_M rows, widths without a divisor of 8, K without one
    of 64, or an output block that is not a whole multiple of 128 bytes are not served (``rwkv_jax.mosaic_ops`` runs the Triton kernel for them)."""
    _, ws = _inputs(1, 1, 256, [64], 1, jnp.float32)
    assert mosaic_segment_linear.supports(1, [64], 256, ws)
    int8 = QuantizedWeight(jnp.zeros((64, 256), jnp.int8), jnp.ones((64, 2), jnp.float32))
    assert not mosaic_segment_linear.supports(1, [64], 256, [int8])
    assert not mosaic_segment_linear.supports(mosaic_segment_linear.MAX_M + 1, [64], 256)
    assert not mosaic_segment_linear.supports(1, [64, 12], 256)
    assert not mosaic_segment_linear.supports(1, [64], 96)
    assert not mosaic_segment_linear.supports(1, [64, 16], 256)  # one row of 16 float32: a 64-byte TMA copy
    assert mosaic_segment_linear.supports(2, [64, 16], 256)      # 16 padded rows of them


def test_mosaic_segment_linear_tiles_fit_the_registers():
    """The rows' [bk, bn] accumulators stay within MAX_ACC_ELEMENTS: bk narrows, then bn."""
    for M in (1, 2, 4, 8, 16):
        bn, bk = mosaic_segment_linear.blocks(M, [2048, 96, 64], 2048)
        assert M * bn * bk <= mosaic_common.MAX_ACC_ELEMENTS and bk >= 64 and bn >= 8
    assert mosaic_segment_linear.blocks(1, [2048, 96], 2048) == (32, 256)


def test_mosaic_pipeline_depth_follows_the_shared_memory_budget():
    """As many stages as the budget holds, at least one, at most MAX_DEPTH and the step count."""
    budget = mosaic_common.SMEM_BUDGET
    assert mosaic_common.pipeline_depth(budget // 3, 16) == 3
    assert mosaic_common.pipeline_depth(budget // 3, 2) == 2
    assert mosaic_common.pipeline_depth(budget * 2, 16) == 1
    assert mosaic_common.pipeline_depth(64, 100) == mosaic_common.MAX_DEPTH
