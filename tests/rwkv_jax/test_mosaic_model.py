"""Whole model with kernels="mosaic-interpret" (the Mosaic GPU kernels in GPU interpret mode with
race detection: shift_mix, segment_linear, lora_up, wkv tail, the dense value product, the head;
the other decode ops as pallas-fused-interpret) equals kernels="xla" on the tiny checkpoint
(float32): logits within 1e-4 and greedy tokens identical over 64 steps at B = 1, and logits and
every state leaf at B = 5 (the batched decode path, past the sparse value product's rows). On
jax < 0.11 naming the Mosaic kernels fails with one line naming the jax needed."""
from __future__ import annotations

import numpy as np
import pytest

import rwkv_jax
from rwkv_jax.kernels import MOSAIC_MIN_JAX, KernelsUnavailable, jax_version

needs_mosaic = pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX, reason="Mosaic GPU interpret mode needs jax >= 0.11")
GREEDY_STEPS = 64  # as the issue asks; interpret mode simulates every thread (~1 s a step)


@pytest.mark.skipif(jax_version() >= MOSAIC_MIN_JAX, reason="this jax has Pallas Mosaic GPU")
@pytest.mark.parametrize("kernels", ["mosaic", "mosaic-interpret"])
def test_mosaic_kernels_need_jax_0_11(tiny_ckpt, kernels):
    with pytest.raises(KernelsUnavailable, match=r"needs jax >= 0\.11"):
        rwkv_jax.load(tiny_ckpt, dtype="float32", kernels=kernels)


@needs_mosaic
def test_mosaic_interpret_greedy_decode_matches_xla(tiny_ckpt):
    from pallas_kernels.mosaic import common as mosaic_common  # jax >= 0.11 only
    mosaic_common.reset_interpreter()
    xla = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="xla")
    mosaic = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="mosaic-interpret")
    token = np.random.default_rng().integers(0, xla.config.vocab_size, (1, 1))
    tokens_x, tokens_m = token, token
    state_x, state_m = xla.init_state(1), mosaic.init_state(1)
    for _ in range(GREEDY_STEPS):
        logits_x, state_x = xla.forward(tokens_x, state_x)
        logits_m, state_m = mosaic.forward(tokens_m, state_m)
        np.testing.assert_allclose(np.asarray(logits_m, np.float32), np.asarray(logits_x, np.float32),
                                   atol=1e-4, rtol=0)
        tokens_x = np.asarray(logits_x).reshape(1, -1).argmax(-1)[:, None]
        tokens_m = np.asarray(logits_m).reshape(1, -1).argmax(-1)[:, None]
        np.testing.assert_array_equal(tokens_m, tokens_x)
    assert not mosaic_common.races_found()


@needs_mosaic
def test_mosaic_interpret_batched_decode_matches_xla(tiny_ckpt):
    from pallas_kernels.mosaic import common as mosaic_common  # jax >= 0.11 only
    mosaic_common.reset_interpreter()
    B = 5  # past SPARSE_MAX_ROWS: the dense (Mosaic) value product
    xla = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="xla")
    mosaic = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="mosaic-interpret")
    rng = np.random.default_rng()
    state_x, state_m = xla.init_state(B), mosaic.init_state(B)
    for _ in range(2):
        tokens = rng.integers(0, xla.config.vocab_size, (B, 1))
        logits_x, state_x = xla.forward(tokens, state_x)
        logits_m, state_m = mosaic.forward(tokens, state_m)
        assert mosaic.last_path is rwkv_jax.select_path(B, 1)
        np.testing.assert_allclose(np.asarray(logits_m), np.asarray(logits_x), atol=1e-4, rtol=0)
        for name, leaf_m, leaf_x in zip(state_x._fields, state_m, state_x):
            np.testing.assert_allclose(np.asarray(leaf_m), np.asarray(leaf_x), atol=1e-4, rtol=0,
                                       err_msg=f"state.{name}")
    assert not mosaic_common.races_found()
