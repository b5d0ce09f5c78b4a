"""Prefill policies: the varlen (flattened, offsets-based) pieces equal per-sequence runs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.shift_mix import add_layer_norm
from pallas_kernels.shift_mix_rows import row_links, shift_mix_rows_reference
from rwkv_jax.varlen import cu_seqlens, segments_from_lengths, wkv_varlen, wkv_varlen_reference


def spec_wkv_step(r, w, k, v, kk, a, S):
    """The spec's recurrence, written out: operands [B, H, N], S [B, H, N, N] (i=value, j=key)."""
    S = (S * w[..., None, :]
         + jnp.einsum("bhij,bhj->bhi", S, -kk)[..., :, None] * (kk * a)[..., None, :]
         + v[..., :, None] * k[..., None, :])
    return jnp.einsum("bhij,bhj->bhi", S, r), S


def _wkv_operands(rng, n_tokens, H, N):
    def f(*s):
        return jnp.asarray(rng.standard_normal(s), jnp.float32)

    kk = f(n_tokens, H, N)
    kk = kk / jnp.linalg.norm(kk, axis=-1, keepdims=True)
    w = jnp.asarray(rng.uniform(0.545, 1.0, (n_tokens, H, N)), jnp.float32)
    a = jnp.asarray(rng.uniform(0.0, 1.0, (n_tokens, H, N)), jnp.float32)
    return f(n_tokens, H, N), w, f(n_tokens, H, N) * 0.3, f(n_tokens, H, N), kk, a


# Empty sequences next to each other, at the front and the back, length-1 sequences,
# and padding tokens after the last sequence.
LENGTHS = [
    ([0, 3, 0, 0, 1, 5, 1, 0, 7, 0], 2),
    ([1, 1, 0, 1, 4, 0, 6], 0),
    ([1], 0),
]


@pytest.mark.parametrize("lengths,pad", LENGTHS)
@pytest.mark.parametrize("n_single_from_front", [False, True])
def test_wkv_varlen_equals_per_sequence(lengths, pad, n_single_from_front):
    rng = np.random.default_rng(sum(lengths) * 7 + pad)
    H, N = 2, 8
    n_tokens = sum(lengths) + pad
    ops = _wkv_operands(rng, n_tokens, H, N)
    state0 = jnp.asarray(rng.standard_normal((len(lengths), H, N, N)), jnp.float32)
    n_single = 0
    if n_single_from_front:
        while n_single < len(lengths) and lengths[n_single] <= 1:
            n_single += 1
    segs = segments_from_lengths(lengths)
    y, finals = jax.jit(wkv_varlen, static_argnames=("wkv_step", "n_single"))(
        *ops, state0, segs, wkv_step=spec_wkv_step, n_single=n_single)
    y_ref, finals_ref = wkv_varlen_reference(*ops, state0, lengths, wkv_step=spec_wkv_step)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(finals), np.asarray(finals_ref), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(y)[sum(lengths):] == 0)
    empty = [p for p, n in enumerate(lengths) if n == 0]
    np.testing.assert_array_equal(np.asarray(finals)[empty], np.asarray(state0)[empty])


@pytest.mark.parametrize("lengths,pad", LENGTHS)
def test_token_shift_varlen_resets_at_each_start(lengths, pad):
    """The varlen rows' token shift (FlatRows -> Ops.shift_mix_rows, its XLA op): a sequence's
    first token mixes with its own carried shift row, later ones with the previous token's
    LayerNorm output; the new shift row is the last token's (the old one for empty sequences)."""
    rng = np.random.default_rng(len(lengths) + pad)
    C = 5
    n_tokens = sum(lengths) + pad
    h = jnp.asarray(rng.standard_normal((n_tokens, C)), jnp.float32)
    shift0 = jnp.asarray(rng.standard_normal((len(lengths), C)), jnp.float32)
    ln_w, ln_b, mix = jnp.ones(C), jnp.zeros(C), jnp.ones((1, C))  # mix 1: the mixed row is prev
    links = row_links(cu_seqlens(segments_from_lengths(lengths)), n_tokens)
    _, mixed, new_shift = jax.jit(shift_mix_rows_reference)(h, None, shift0, ln_w, ln_b, mix, links)
    x = np.asarray(add_layer_norm(h, None, ln_w, ln_b)[1])
    pos = 0
    for p, n in enumerate(lengths):
        expect_prev = np.concatenate([np.asarray(shift0[p:p + 1]), x[pos:pos + n]])
        np.testing.assert_allclose(np.asarray(mixed[0][pos:pos + n]), expect_prev[:n], atol=1e-6)
        np.testing.assert_allclose(np.asarray(new_shift[p]), expect_prev[n], atol=1e-6)
        pos += n


def test_segments_from_lengths_rejects_bad_input():
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        segments_from_lengths([3, -1])
    with pytest.raises(ValueError, match="n_seqs"):
        segments_from_lengths([1, 2, 3], n_seqs=2)
    segs = segments_from_lengths([2, 0, 3], n_seqs=5)
    assert segs.starts.tolist() == [0, 2, 2, 5, 5] and segs.lengths.tolist() == [2, 0, 3, 0, 0]


def test_plan_pieces_fills_budget_first_come_first_served():
    from scheduler.prefill import plan_pieces
    assert plan_pieces([5, 300, 7], budget=256) == [5, 251]
    assert plan_pieces([5, 3, 7], budget=256) == [5, 3, 7]
    assert plan_pieces([5, 3, 7], budget=8) == [5, 3]
    assert plan_pieces([1000], budget=256) == [256]
    assert plan_pieces([1, 1, 1, 1], budget=256, max_pieces=3) == [1, 1, 1]
    assert plan_pieces([], budget=256) == []
    rng = np.random.default_rng(0)
    for _ in range(50):
        remaining = rng.integers(1, 100, rng.integers(1, 12)).tolist()
        budget, cap = int(rng.integers(1, 300)), int(rng.integers(1, 6))
        counts = plan_pieces(remaining, budget, cap)
        assert len(counts) <= cap and sum(counts) <= budget
        assert all(c == n for c, n in zip(counts[:-1], remaining))   # only the last is cut
        assert sum(counts) == min(budget, sum(remaining[:cap]))
    with pytest.raises(ValueError, match="budget"):
        plan_pieces([3], budget=0)
    with pytest.raises(ValueError, match="tokens left"):
        plan_pieces([0, 3], budget=4)


def test_varlen_shape_rounds_to_powers_of_two():
    from rwkv7_core.engine import varlen_shape
    assert [varlen_shape(n) for n in (1, 16, 17, 256, 257)] == [16, 16, 32, 256, 512]
    with pytest.raises(ValueError):
        varlen_shape(0)


@pytest.fixture(scope="module")
def tiny_model(tiny_ckpt):
    import rwkv_jax
    return rwkv_jax.load(tiny_ckpt.with_suffix(".safetensors"), dtype="float32", kernels="xla")


def _run_alone(model, tokens, state=None):
    """(logits [1, V] | None, state) after feeding `tokens` one at a time (B=1, T=1)."""
    state = model.init_state(1) if state is None else state
    logits = None
    for t in tokens:
        logits, state = model.forward(np.asarray([[t]]), state)
    return logits, state


def _states_after(model, prefixes):
    """A State with one row per prefix, each row the state after that prefix alone."""
    from rwkv_jax.state import State
    rows = [_run_alone(model, prefix)[1] for prefix in prefixes]
    return State(*(jnp.concatenate(leaves, axis=0) for leaves in zip(*rows)))


def test_varlen_forward_equals_per_sequence_forward(tiny_model):
    """Varlen prefill of sequences with random start states vs each run alone; the mixed
    step's n_single form is covered by the policy test below."""
    from rwkv_jax.forward import varlen_forward_fn
    m = tiny_model
    rng = np.random.default_rng(11)
    lengths = [0, 1, 0, 0, 64, 1, 3, 0, 119]
    prefixes = [rng.integers(1, 512, int(rng.integers(0, 6))).tolist() for _ in lengths]
    prompts = [rng.integers(0, 512, n).tolist() for n in lengths]
    n_tokens = sum(lengths) + 7   # padding after the last sequence
    flat = np.zeros(n_tokens, np.int32)
    flat[:sum(lengths)] = np.concatenate([np.asarray(p, np.int64) for p in prompts])
    segs = segments_from_lengths(lengths)
    fn = jax.jit(varlen_forward_fn, static_argnames=("config", "kernels", "n_single"))
    logits, state = fn(m.params, jnp.asarray(flat), _states_after(m, prefixes), segs.starts,
                       segs.lengths, config=m.config, kernels="xla")
    for p, (prefix, prompt) in enumerate(zip(prefixes, prompts)):
        ref_logits, ref_state = _run_alone(m, prefix + prompt)
        if prompt:
            np.testing.assert_allclose(np.asarray(logits[p]), np.asarray(ref_logits[0]),
                                       rtol=1e-4, atol=1e-4, err_msg=f"logits of sequence {p}")
        for name, got, want in zip(("att_shift", "wkv", "ffn_shift"), state, ref_state):
            np.testing.assert_allclose(np.asarray(got[p]), np.asarray(want[0]), rtol=1e-4,
                                       atol=1e-4, err_msg=f"{name} of sequence {p}")


def test_varlen_and_mixed_policies_match_serial_greedy_tokens(tiny_model):
    """Prompts of 1..150 tokens, budget 32 (long prompts are cut and carried across calls),
    max_batch 4 so admissions, shrinks and mixed steps with live rows all happen."""
    from rwkv_jax.engine import JaxEngine
    from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
    rng = np.random.default_rng(5)
    lengths = [150, 1, 2, 7, 90, 33, 1, 64, 5, 120]
    requests = [Request(f"r{i}", rng.integers(0, 512, n).tolist(),
                        SamplingParams(max_tokens=int(rng.integers(1, 12)), stop_tokens=[]))
                for i, n in enumerate(lengths)]
    tokens, paths = {}, {}
    engine = JaxEngine(tiny_model, prefill_pieces=(32, 4, 1))  # shared: its executables are reused
    for policy in ("serial", "varlen", "mixed", "auto"):
        scheduler = Scheduler(engine,
                              SchedulerConfig(max_batch=4, prefill_policy=policy, chunk=32))
        for r in requests:
            scheduler.add(r)
        scheduler.run()
        out = [scheduler.results[r.id] for r in requests]
        assert all(o.finish_reason == "length" for o in out), [o.error for o in out]
        tokens[policy] = [o.tokens for o in out]
        paths[policy] = {s.path for s in scheduler.stats.steps}
        assert sum(p.tokens for p in scheduler.stats.prefills) == sum(lengths)
    assert tokens["varlen"] == tokens["serial"]
    assert tokens["mixed"] == tokens["serial"] and tokens["auto"] == tokens["serial"]
    assert "DENSE" in paths["mixed"] and "DENSE" not in paths["serial"]

    # With the prefix cache: a shared 70-token system prompt (cached at its 64-token block
    # boundary) and an exact duplicate prompt hit, and the tokens do not change.
    system = rng.integers(0, 512, 70).tolist()
    shared = [Request(f"s{i}", system + rng.integers(0, 512, n).tolist(), SamplingParams(max_tokens=4))
              for i, n in enumerate([3, 40, 1, 9])]
    shared += [Request("dup", shared[2].prompt_tokens, SamplingParams(max_tokens=4))]
    cached = {}
    for policy, cache_bytes in (("serial", 0), ("varlen", 10**8), ("mixed", 10**8), ("auto", 10**8)):
        scheduler = Scheduler(engine, SchedulerConfig(max_batch=4, prefill_policy=policy, chunk=32,
                                                      prefix_cache_bytes=cache_bytes))
        for r in shared:
            scheduler.add(r)
        scheduler.run()
        cached[policy] = [scheduler.results[r.id].tokens for r in shared]
        assert scheduler.stats.prefix_hits >= (len(shared) - 1 if cache_bytes else 0)
    assert cached["varlen"] == cached["serial"] and cached["mixed"] == cached["serial"] == cached["auto"]


def test_policies_need_engine_support():
    from scheduler import Scheduler, SchedulerConfig
    from tests.support.scheduler_engines import FakeEngine
    Scheduler(FakeEngine(), SchedulerConfig(prefill_policy="serial"))
    Scheduler(FakeEngine(), SchedulerConfig(prefill_policy="auto"))  # falls back to serial
    for policy, capability in (("varlen", "Capability.VARLEN_PREFILL"), ("mixed", "Capability.MIXED_STEP")):
        with pytest.raises(ValueError, match=capability):
            Scheduler(FakeEngine(), SchedulerConfig(prefill_policy=policy))
