"""Whole model: kernels="pallas-interpret" and "pallas-fused-interpret" equal kernels="xla" on the
tiny checkpoint (float32), logits and every state leaf within 1e-4, with the state carried over
several calls."""
from __future__ import annotations

import numpy as np
import pytest

import rwkv_jax

STEPS = 3


@pytest.mark.parametrize("kernels,B,T", [("pallas-interpret", 1, 1), ("pallas-interpret", 4, 1),
                                         ("pallas-interpret", 1, 17), ("pallas-interpret", 3, 1),
                                         ("pallas-fused-interpret", 1, 1), ("pallas-fused-interpret", 3, 1),
                                         ("pallas-fused-interpret", 20, 1)])
def test_pallas_interpret_model_matches_xla(tiny_ckpt, kernels, B, T):
    xla = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels="xla")
    pallas = rwkv_jax.load(tiny_ckpt, dtype="float32", kernels=kernels)
    rng = np.random.default_rng(100 * B + T)
    state_x, state_p = xla.init_state(B), pallas.init_state(B)
    for _ in range(STEPS):
        tokens = rng.integers(0, xla.config.vocab_size, (B, T))
        logits_x, state_x = xla.forward(tokens, state_x)
        logits_p, state_p = pallas.forward(tokens, state_p)
        assert pallas.last_path is rwkv_jax.select_path(B, T)
        np.testing.assert_allclose(np.asarray(logits_p), np.asarray(logits_x), atol=1e-4, rtol=0)
        for name, leaf_p, leaf_x in zip(state_x._fields, state_p, state_x):
            np.testing.assert_allclose(np.asarray(leaf_p), np.asarray(leaf_x), atol=1e-4, rtol=0,
                                       err_msg=f"state.{name}")
    assert np.abs(np.asarray(state_p.wkv)).max() > 0  # the carried state really evolved


def test_fused_model_falls_back_where_the_kernels_cannot_serve(odd_ckpt):
    """ODD_CONFIG's LoRA widths (24, 40, 20, 56) have no 16-wide block: the fused path runs the
    time-mix reference on the layer's rows and still updates the whole state leaves."""
    xla = rwkv_jax.load(odd_ckpt, dtype="float32", kernels="xla")
    fused = rwkv_jax.load(odd_ckpt, dtype="float32", kernels="pallas-fused-interpret")
    tokens = np.random.default_rng(7).integers(0, xla.config.vocab_size, (2, 1))
    (lx, sx), (lf, sf) = xla.forward(tokens, xla.init_state(2)), fused.forward(tokens, fused.init_state(2))
    np.testing.assert_allclose(np.asarray(lf), np.asarray(lx), atol=1e-4, rtol=0)
    for leaf_f, leaf_x in zip(sf, sx):
        np.testing.assert_allclose(np.asarray(leaf_f), np.asarray(leaf_x), atol=1e-4, rtol=0)
