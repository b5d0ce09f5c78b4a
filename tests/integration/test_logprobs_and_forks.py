"""Capability.LOGPROBS and row forks on both engines (tiny model, float32).

- ``token_logprobs`` in JAX and torch equals the numpy reference (rwkv7_core.sampling).
- ``step_logprobs`` draws what ``step`` draws and scores it on the step's own logits;
  ``prompt_logprobs`` equals log_softmax of the model's full-output logits.
- One prefilled row inserted into several slots: each slot, sampled with its own seed,
  draws what that seed draws alone, and the row itself is left unchanged (no aliasing).
"""
import numpy as np
import pytest

from rwkv7_core import sampling as ref
from rwkv7_core.engine import Capability, check_capabilities
from rwkv7_core.sampling import SamplingParams

V = 512


@pytest.fixture(scope="module", params=["jax", "torch"])
def backend(request, tiny_ckpt):
    if request.param == "jax":
        import rwkv_jax
        from rwkv_jax.engine import JaxEngine
        model = rwkv_jax.load(tiny_ckpt, dtype="float32")
        return "jax", model, JaxEngine(model, prefill_pieces=(16, 1))
    import rwkv_torch_ref
    from rwkv_torch_ref.engine import TorchEngine
    model = rwkv_torch_ref.load(tiny_ckpt, dtype="float32")
    return "torch", model, TorchEngine(model)


def test_token_logprobs_match_the_numpy_reference():
    import jax.numpy as jnp
    import torch

    from rwkv_jax.sampling import token_logprobs as jax_lp
    from rwkv_torch_ref.sampling import token_logprobs as torch_lp
    rng = np.random.default_rng()
    logits = (rng.standard_normal((5, V)) * 4).astype(np.float32)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie: the lower id first
    tokens = rng.integers(0, V, 5).astype(np.int32)
    want = ref.token_logprobs(logits, tokens)
    assert want.top_ids[2, 0] == 7 and want.top_ids[2, 1] == 9
    for got in (jax_lp(jnp.asarray(logits), jnp.asarray(tokens)),
                torch_lp(torch.from_numpy(logits), torch.from_numpy(tokens))):
        got = [np.asarray(a) for a in got]
        np.testing.assert_allclose(got[0], want.chosen, atol=1e-5)
        np.testing.assert_array_equal(got[1], want.top_ids)
        np.testing.assert_allclose(got[2], want.top_logprobs, atol=1e-5)


def test_prompt_and_step_logprobs(backend):
    name, model, engine = backend
    assert Capability.LOGPROBS in engine.capabilities
    check_capabilities(engine)
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, 19).astype(np.int32)
    logits, _ = model.forward(prompt[None], model.init_state(1), full_output=True)
    full = np.asarray(logits, np.float32)[0]
    want = ref.token_logprobs(full[:-1], prompt[1:])
    got = engine.prompt_logprobs(prompt)
    np.testing.assert_allclose(got.chosen, want.chosen, atol=2e-4)
    np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, atol=2e-4)

    row = engine.prefill(prompt)
    first = engine.sample(row, SamplingParams(seed=1), 0)
    scored = engine.row_logprobs(row, first)
    np.testing.assert_allclose(scored.chosen, ref.token_logprobs(full[-1:], np.array([first])).chosen, atol=2e-4)

    engine.resize([], 2)
    for slot in range(2):
        engine.insert(slot, row, SamplingParams(temperature=0.0 if slot == 0 else 1.0, seed=slot))
    tokens, positions = np.array([first, first], np.int32), np.ones(2, np.int32)
    plain_engine_state = engine.extract(0), engine.extract(1)
    drawn, lp = engine.step_logprobs(tokens, positions)
    assert lp.chosen.shape == (2,) and lp.top_ids.shape == (2, ref.TOP_LOGPROBS)
    assert lp.top_ids[0, 0] == drawn[0] and lp.chosen[0] == pytest.approx(lp.top_logprobs[0, 0])  # greedy row
    for slot in range(2):  # the same step without logprobs draws the same tokens
        engine.insert(slot, plain_engine_state[slot], SamplingParams(temperature=0.0 if slot == 0 else 1.0, seed=slot))
    np.testing.assert_array_equal(engine.step(tokens, positions), drawn)


def test_one_row_in_many_slots_is_copied_not_shared(backend):
    name, model, engine = backend
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, 9).astype(np.int32)
    row = engine.prefill(prompt)
    before = engine.to_host(row)
    seeds = rng.integers(0, 2**32, 3).tolist()
    params = [SamplingParams(temperature=1.0, seed=s) for s in seeds]

    def decode(slots_params, bucket, steps=5):
        engine.resize([], bucket)
        firsts = [engine.sample(row, p, 0) for p in slots_params]
        for slot, p in enumerate(slots_params):
            engine.insert(slot, row, p)
        tok = np.zeros(bucket, np.int32)
        tok[:len(firsts)] = firsts
        out = [[f] for f in firsts]
        for i in range(steps):
            tok = engine.step(tok, np.full(bucket, i + 1, np.int32))
            for slot in range(len(slots_params)):
                out[slot].append(int(tok[slot]))
        return out

    together = decode(params, 4)
    alone = [decode([p], 1)[0] for p in params]
    assert together == alone
    assert len({tuple(t) for t in together}) == 3
    for a, b in zip(before, engine.to_host(row)):  # the row itself never changed
        np.testing.assert_array_equal(a, b)
