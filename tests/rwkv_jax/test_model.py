"""JAX (xla kernels) vs the official `rwkv` package and the torch reference, float32.

Each comparison runs the same random tokens through all three and asserts max |logit
diff| <= 1e-4 and final states within 1e-4: step form (T=1 calls), sequence form
(full_output over T tokens) and uneven chunks with the state carried between calls.
"""
import copy
import os

import numpy as np
import pytest

import rwkv_jax
from rwkv_jax import Path

TOL = 1e-4


@pytest.fixture(scope="module", params=["tiny_ckpt", "odd_ckpt"])
def models(request):
    """(jax model, torch reference, official package model, vocab size) for one checkpoint."""
    path = request.getfixturevalue(request.param)
    os.environ["RWKV_V7_ON"] = "1"
    from rwkv.model import RWKV

    import rwkv_torch_ref
    jax_model = rwkv_jax.load(path)
    official = RWKV(model=str(path)[:-len(".pth")], strategy="cpu fp32")
    return jax_model, rwkv_torch_ref.load(path), official, jax_model.config


def _official(model, tokens: list[int], state, full_output=False):
    """Run the official package without mutating the caller's state list."""
    logits, state = model.forward(tokens, copy.deepcopy(state), full_output=full_output)
    return logits.float().numpy(), state


def _assert_states_close(jax_state, torch_state, official_state, L):
    """All three states of one sequence (batch row 0) agree within TOL."""
    for part, name in enumerate(("att_shift", "wkv", "ffn_shift")):
        j = np.asarray(jax_state[part][0])
        t = torch_state[part][0].numpy()
        o = np.stack([official_state[3 * layer + part].numpy() for layer in range(L)])
        np.testing.assert_allclose(j, t, atol=TOL, rtol=0, err_msg=f"state.{name} jax vs torch")
        np.testing.assert_allclose(j, o, atol=TOL, rtol=0, err_msg=f"state.{name} jax vs official")


def test_step_form_matches_torch_and_official(models):
    m, ref, official, config = models
    tokens = np.random.default_rng(11).integers(0, config.vocab_size, size=6)
    js, ts, os_ = m.init_state(1), ref.init_state(1), None
    for tok in tokens:
        jl, js = m.forward(np.array([[tok]]), js)
        assert m.last_path is Path.B1T1
        tl, ts = ref.forward(np.array([[tok]]), ts)
        ol, os_ = _official(official, [int(tok)], os_)
        np.testing.assert_allclose(np.asarray(jl[0]), tl[0].numpy(), atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(jl[0]), ol, atol=TOL, rtol=0)
    _assert_states_close(js, ts, os_, config.n_layer)


def test_sequence_form_full_output_matches(models):
    m, ref, official, config = models
    tokens = np.random.default_rng(12).integers(0, config.vocab_size, size=(1, 8))
    jl, js = m.forward(tokens, m.init_state(1), full_output=True)
    assert m.last_path is Path.DENSE and jl.shape == (1, 8, config.vocab_size)
    tl, ts = ref.forward(tokens, ref.init_state(1), full_output=True)
    ol, os_ = _official(official, tokens[0].tolist(), None, full_output=True)
    np.testing.assert_allclose(np.asarray(jl[0]), tl[0].numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(jl[0]), ol, atol=TOL, rtol=0)
    _assert_states_close(js, ts, os_, config.n_layer)


def test_uneven_chunks_with_state_carry_match(models):
    """Chunks of 3, 1 and 8 tokens (the last with full_output) carry the state between calls."""
    m, ref, official, config = models
    tokens = np.random.default_rng(13).integers(0, config.vocab_size, size=12)
    js, ts, os_ = m.init_state(1), ref.init_state(1), None
    start = 0
    for size in (3, 1, 8):
        chunk = tokens[start:start + size]
        start += size
        full = size == 8
        jl, js = m.forward(chunk[None], js, full_output=full)
        tl, ts = ref.forward(chunk[None], ts, full_output=full)
        ol, os_ = _official(official, chunk.tolist(), os_, full_output=full)
        np.testing.assert_allclose(np.asarray(jl[0]), tl[0].numpy(), atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(jl[0]), ol, atol=TOL, rtol=0)
    _assert_states_close(js, ts, os_, config.n_layer)
