"""The wkv state held in bfloat16 / float16 (``state_dtype``) against the float32 state, on
every path of the JAX model (XLA, the native CPU kernels, the Pallas kernels and the fused decode
kernels, run by the Pallas interpreter), the engine's varlen prefill and mixed step and its host rows, and the
torch reference with the same state dtype.

Tolerances, relative to the float32-state logits' standard deviation: the state is rounded
(unit roundoff 2^-9 bfloat16, 2^-11 float16) where a call stores it, so each decode step
adds one rounding of every state value. On this tiny model a 24-token prefill plus 10 decode
steps measured mean / max |difference| 4e-4 / 7e-3 (bfloat16) and 5e-5 / 7e-4 (float16) of the
std on every kernel choice, with the argmax unchanged; we allow five times that. jax and torch
round at the same points, so with one state dtype they agree as closely as in float32
(measured 1e-5 absolute; allowed 1e-3 of the std).
"""
from __future__ import annotations

import numpy as np
import pytest

import rwkv_jax
from rwkv7_core.engine import host_row_bytes
from rwkv7_core.sampling import SamplingParams
from rwkv7_core.state import StateDtypeError
from rwkv_jax.engine import JaxEngine

LIMITS = {"bfloat16": (2e-3, 3.5e-2), "float16": (2.5e-4, 3.5e-3)}  # (mean, max) / logit std


def _run(model, first, second, decode):
    """Logits of a T=8 prefill, a T=24 prefill (the chunked kernel on Pallas) from its state,
    len(decode) steps of both rows (BATCHED_DECODE) and of row 0 alone (B1T1); and the state."""
    lg, state = model.forward(first, model.init_state(2))
    out = [np.asarray(lg)]
    lg, state = model.forward(second, state, full_output=True)
    out.append(np.asarray(lg).reshape(-1, lg.shape[-1]))
    for t in range(decode.shape[1]):
        lg, state = model.forward(decode[:, t:t + 1], state)
        out.append(np.asarray(lg))
    row = type(state)(*(leaf[:1] for leaf in state))
    for t in range(decode.shape[1]):
        lg, row = model.forward(decode[:1, t:t + 1], row)
        out.append(np.asarray(lg))
    return np.concatenate(out), row


def _close(got, ref, state_dtype):
    diff, scale = np.abs(got - ref), ref.std()
    mean, worst = LIMITS[state_dtype]
    assert diff.mean() <= mean * scale, f"mean |diff| {diff.mean() / scale:.2e} std"
    assert diff.max() <= worst * scale, f"max |diff| {diff.max() / scale:.2e} std"
    assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.95


@pytest.fixture(scope="module")
def tokens(tiny_ckpt):
    rng = np.random.default_rng()
    return tuple(rng.integers(0, 512, shape) for shape in ((2, 8), (2, 24), (2, 5)))


@pytest.fixture(scope="module")
def float32_run(tiny_ckpt, tokens):
    return _run(rwkv_jax.load(tiny_ckpt), *tokens)[0]


@pytest.mark.parametrize("kernels", ["xla", "native", "pallas-interpret", "pallas-fused-interpret"])
@pytest.mark.parametrize("state_dtype", ["bfloat16", "float16"])
def test_every_path_with_a_16_bit_state_tracks_the_float32_state(tiny_ckpt, tokens, float32_run, kernels,
                                                                 state_dtype):
    model = rwkv_jax.load(tiny_ckpt, kernels=kernels, state_dtype=state_dtype)
    got, state = _run(model, *tokens)
    assert state.wkv.dtype == np.dtype(state_dtype) and state.att_shift.dtype == np.float32
    _close(got, float32_run, state_dtype)


def test_a_state_of_another_dtype_is_refused_by_forward(tiny_ckpt):
    model = rwkv_jax.load(tiny_ckpt, state_dtype="bfloat16")
    wrong = rwkv_jax.load(tiny_ckpt).init_state(1)
    with pytest.raises(ValueError, match=r"state.wkv has dtype float32, expected bfloat16"):
        model.forward(np.zeros((1, 1), np.int64), wrong)
    with pytest.raises(ValueError, match="state_dtype 'float64' not supported"):
        rwkv_jax.load(tiny_ckpt, state_dtype="float64")


def test_varlen_prefill_mixed_step_and_host_rows_with_a_bfloat16_state(tiny_ckpt):
    rng = np.random.default_rng()
    prompts = [rng.integers(0, 512, n) for n in (11, 19)]
    later = rng.integers(0, 512, 7)
    results = {}
    for state_dtype in ("float32", "bfloat16"):
        engine = JaxEngine(rwkv_jax.load(tiny_ckpt, state_dtype=state_dtype), prefill_pieces=(16, 1))
        rows = engine.prefill_varlen(prompts, [None, None], 32)
        engine.resize([], 2)
        for slot, row in enumerate(rows):
            engine.insert(slot, row, SamplingParams(temperature=0.0))
        _, mixed = engine.mixed_step(np.array([3, 4]), np.zeros(2, np.int32), [later], [None], 16)
        extracted = engine.extract(1)
        results[state_dtype] = [np.asarray(r[1]) for r in rows + mixed], extracted, engine
    ref = np.stack(results["float32"][0])
    got = np.stack(results["bfloat16"][0])
    _close(got, ref, "bfloat16")
    row, engine = results["bfloat16"][1], results["bfloat16"][2]
    host = engine.to_host(row)
    assert host[1].dtype == np.dtype("bfloat16")
    f32_host = results["float32"][2].to_host(results["float32"][1])
    assert host_row_bytes(host) < 0.52 * host_row_bytes(f32_host)  # the prefix cache keeps twice the states
    again = engine.to_host(engine.from_host(host))
    assert all(np.array_equal(a, b) for a, b in zip(host[:3], again[:3]))
    with pytest.raises(StateDtypeError, match="host row: its wkv state is float32 but this model holds its "
                                              "state in bfloat16"):
        engine.from_host(f32_host)


def test_jax_and_torch_agree_with_a_bfloat16_state(tiny_ckpt, tokens):
    import torch

    import rwkv_torch_ref

    jax_model = rwkv_jax.load(tiny_ckpt, state_dtype="bfloat16")
    torch_model = rwkv_torch_ref.load(tiny_ckpt, state_dtype="bfloat16")
    got, jax_row = _run(jax_model, *tokens)
    ref, torch_row = _run(torch_model, *(torch.from_numpy(t) for t in tokens))
    assert torch_row.wkv.dtype == torch.bfloat16
    assert np.abs(got - ref).max() <= 1e-3 * ref.std()
    theirs = torch_row.wkv.float().numpy()
    assert np.abs(np.asarray(jax_row.wkv, np.float32) - theirs).max() <= 2 ** -7 * np.abs(theirs).max()
