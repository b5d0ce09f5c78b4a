"""The JAX and torch engines under the scheduler, on the tiny model (float32).

Each request's tokens must equal the request decoded alone with ``model.forward`` one token
at a time, whatever batch it shared and whichever buckets it ran in.
"""
import re

import numpy as np
import pytest

from rwkv7_core import sampling as np_sampling
from rwkv7_core.token_mask import ALL_ALLOWED, pack_allowed, unpack_allowed
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate

V = 512


@pytest.fixture(scope="module", params=["jax", "torch"])
def backend(request, tiny_ckpt):
    """(name, model, engine); one engine per backend so compiled executables are shared."""
    if request.param == "jax":
        import rwkv_jax
        from rwkv_jax.engine import JaxEngine
        model = rwkv_jax.load(tiny_ckpt, dtype="float32")
        return "jax", model, JaxEngine(model, prefill_pieces=(16, 1))  # few compiles
    import torch

    import rwkv_torch_ref
    from rwkv_torch_ref.engine import TorchEngine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: intra-op threads only contend with the prefill thread
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    model = rwkv_torch_ref.load(tiny_ckpt, dtype="float32")
    return "torch", model, TorchEngine(model)


def solo_greedy(model, prompt, max_tokens):
    """Greedy decode of one request with model.forward, one token at a time."""
    state = model.init_state(1)
    for t in prompt:
        logits, state = model.forward(np.array([[t]]), state)
    out = []
    while len(out) < max_tokens:
        out.append(int(np.argmax(np.asarray(logits)[0])))
        logits, state = model.forward(np.array([[out[-1]]]), state)
    return out


def test_engine_under_scheduler(backend, monkeypatch):
    """One test per backend, so that under pytest-xdist a single process compiles the JAX
    executables (every check below reuses them)."""
    name, model, engine = backend
    check_greedy_batch_invariance(model, engine)
    check_seeded_sampling_same_at_max_batch_1_and_8(engine)
    check_prefix_cache_hits_equal_misses(engine)
    check_slot_ops_and_host_rows_round_trip(engine)
    check_token_masks_restrict_draws_and_all_allowed_changes_nothing(engine)
    check_failed_step_fails_its_requests_and_engine_recovers(name, model, engine, monkeypatch)
    if name == "jax":
        check_resize_gathers_compile_with_their_buckets_or_on_first_use(engine)
        check_constrained_rows_in_the_mixed_step(engine)


def check_greedy_batch_invariance(model, engine):
    rng = np.random.default_rng(42)
    requests = [Request(f"r{i}", rng.integers(0, V, int(rng.integers(1, 61))).tolist(),
                        SamplingParams(max_tokens=int(rng.integers(1, 41)), stop_tokens=()))
                for i in range(24)]
    # precompiled: every shrink is to a compiled bucket, so the batch moves through them all
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=8, precompile=True))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    shrinks = [s for s in scheduler.stats.switches if s.to_bucket < s.from_bucket]
    grows = [s for s in scheduler.stats.switches if s.to_bucket > s.from_bucket]
    assert shrinks and grows and max(s.bucket for s in scheduler.stats.steps) == 8
    for r in requests:
        out = scheduler.results[r.id]
        assert out.finish_reason == "length", out.error
        assert out.tokens == solo_greedy(model, r.prompt_tokens, r.params.max_tokens), r.id


def check_seeded_sampling_same_at_max_batch_1_and_8(engine):
    rng = np.random.default_rng(9)
    requests = []
    for i in range(12):
        params = SamplingParams(max_tokens=int(rng.integers(1, 16)), temperature=float(rng.uniform(0.5, 1.5)),
                                top_p=float(rng.uniform(0.3, 1.0)), top_k=int(rng.integers(0, 50)),
                                presence_penalty=0.3, frequency_penalty=0.2, penalty_decay=0.95,
                                banned_tokens=tuple(rng.integers(0, V, 4).tolist()), stop_tokens=(),
                                seed=int(rng.integers(2**32)))
        requests.append(Request(f"s{i}", rng.integers(0, V, int(rng.integers(1, 30))).tolist(), params))
    one = generate(engine, requests, SchedulerConfig(max_batch=1))
    eight = generate(engine, requests, SchedulerConfig(max_batch=8))
    assert all(o.finish_reason == "length" for o in one + eight)
    assert [o.tokens for o in one] == [o.tokens for o in eight]
    greedy = generate(engine, [Request(r.id, r.prompt_tokens, SamplingParams(max_tokens=r.params.max_tokens,
                                                                             stop_tokens=()))
                               for r in requests], SchedulerConfig(max_batch=8))
    assert [o.tokens for o in greedy] != [o.tokens for o in one]
    for r, o in zip(requests, one):
        assert not set(o.tokens) & set(r.params.banned_tokens)


def check_prefix_cache_hits_equal_misses(engine):
    rng = np.random.default_rng(4)
    system = rng.integers(0, V, 40).tolist()
    requests = [Request(f"p{i}", system + rng.integers(0, V, int(rng.integers(1, 12))).tolist(),
                        SamplingParams(max_tokens=6, stop_tokens=())) for i in range(5)]
    requests.append(Request("same", requests[1].prompt_tokens, requests[1].params))
    cached = Scheduler(engine, SchedulerConfig(max_batch=4, prefix_cache_bytes=64 << 20, prefix_block=32))
    for r in requests:
        cached.add(r)
    cached.run()
    assert cached.stats.prefix_misses == 1 and cached.stats.prefix_hits == 5
    plain = generate(engine, requests, SchedulerConfig(max_batch=4))
    assert [cached.results[r.id].tokens for r in requests] == [o.tokens for o in plain]


def check_slot_ops_and_host_rows_round_trip(engine):
    row = engine.prefill(np.array([5, 6, 7], np.int32))
    host = engine.to_host(row)
    again = engine.to_host(engine.from_host(host))
    assert all(np.array_equal(a, b) for a, b in zip(host, again))
    engine.resize([], 2)
    engine.insert(1, row, SamplingParams())
    engine.resize([1], 1)
    state = engine.to_host(engine.extract(0))
    assert all(np.array_equal(a, b) for a, b in zip(state[:3], host[:3]))
    with pytest.raises(ValueError, match="slot"):
        engine.insert(3, row, SamplingParams())


def check_token_masks_restrict_draws_and_all_allowed_changes_nothing(engine):
    """Capability.TOKEN_MASK: a row draws only allowed tokens (steps and the first-token draw);
    a row whose mask allows everything draws what the unmasked executables draw; masks given
    as a function draw what the same masks given as an array draw."""
    rng = np.random.default_rng()
    row = engine.prefill(rng.integers(0, V, 5).astype(np.int32))
    params = [SamplingParams(temperature=1.0, seed=int(rng.integers(2**32)), stop_tokens=()) for _ in range(2)]
    allowed = rng.random((2, V)) < 0.03
    allowed[:, rng.integers(0, V)] = True
    masks = pack_allowed(allowed)
    masks[1] = ALL_ALLOWED

    def run(**masked):
        engine.resize([], 2)
        for slot, p in enumerate(params):
            engine.insert(slot, row, p)
        return np.array([engine.step(np.array([3, 4], np.int32), np.array([i, i], np.int32), **masked)
                         for i in range(3)])

    masked, plain, deferred = run(allowed=masks), run(), run(allowed=lambda: masks)
    assert allowed[0, masked[:, 0]].all() and masked[:, 1].tolist() == plain[:, 1].tolist()
    assert deferred.tolist() == masked.tolist()  # a mask function (called while the forward runs): the same
    assert allowed[0, engine.sample(row, params[0], 0, allowed=masks[0])]
    assert engine.sample(row, params[1], 0, allowed=masks[1]) == engine.sample(row, params[1], 0)


class ByteTokenizer:
    """Token i < 256 is byte i (0: end-of-text), the rest of the tiny vocabulary no text."""

    def decode_bytes(self, ids):
        return b"".join(bytes([i]) if 0 < i < 256 else b"" for i in ids)


def check_constrained_rows_in_the_mixed_step(engine):
    """MIXED prefill: prompt pieces ride in the masked decode step; constrained rows still
    draw only what their grammar allows, and the same as SERIAL prefill gives them."""
    from scheduler.constraint import Constraint
    rng = np.random.default_rng()
    requests = [Request(f"m{i}", rng.integers(0, V, int(rng.integers(20, 50))).tolist(),
                        SamplingParams(max_tokens=12, temperature=1.0, seed=int(rng.integers(2**32))),
                        constraint=Constraint.regex("[a-f]{3}-[0-9]") if i % 2 else Constraint.choice(["on", "off"]))
                for i in range(6)]
    runs = [generate(engine, requests, SchedulerConfig(max_batch=4, buckets=[4], prefill_policy=policy, chunk=16),
                     tokenizer=ByteTokenizer()) for policy in ("mixed", "serial")]
    for out in runs[0]:
        text = bytes(out.tokens).decode()
        assert out.finish_reason == "stop" and re.fullmatch(r"[a-f]{3}-[0-9]|on|off", text), (out.error, text)
    assert [o.tokens for o in runs[0]] == [o.tokens for o in runs[1]]


def check_resize_gathers_compile_with_their_buckets_or_on_first_use(engine):
    """compile([a]) then compile([b]) compiles no gather between them (most bucket pairs
    never resize into each other); the first resize compiles it, reported as a compile
    event; buckets compiled in one call (``--precompile``) get theirs up front."""
    cache, events = engine.executables, []
    engine.add_compile_listener(lambda what, start, seconds: events.append(what))
    engine.compile([3])
    engine.compile([5])
    assert ("gather", (3, 5)) not in cache and ("gather", (5, 3)) not in cache
    rng = np.random.default_rng()
    row = engine.prefill(rng.integers(0, V, int(rng.integers(2, 9))).astype(np.int32))
    engine.resize([], 5)
    slot = int(rng.integers(0, 5))
    engine.insert(slot, row, SamplingParams())
    engine.resize([slot], 3)
    assert "gather:(5, 3)" in events
    kept = engine.to_host(engine.extract(0))
    assert all(np.array_equal(a, b) for a, b in zip(kept[:3], engine.to_host(row)[:3]))
    engine.compile([6, 3])
    assert ("gather", (3, 6)) in cache and ("gather", (6, 3)) in cache and ("gather", (5, 6)) not in cache


@pytest.mark.parametrize("name", ["jax", "jax-unrolled", "torch"])
def test_device_sampling_matches_numpy_reference(name):
    form = {}
    if name.startswith("jax"):
        import jax.numpy as xp

        from rwkv_jax import sampling as dev

        def to_dev(a):
            return xp.asarray(a)
        form = {"form": dev.SearchForm.UNROLLED if name == "jax-unrolled" else dev.SearchForm.LOOP}
    else:
        import torch

        from rwkv_torch_ref import sampling as dev

        def to_dev(a):
            return torch.from_numpy(a.astype(np.int64) if a.dtype == np.uint32 else a)
    rng = np.random.default_rng(0)
    B = 16
    params = [SamplingParams(temperature=float(rng.choice([0, 0.7, 1.3])), top_p=float(rng.uniform(0.2, 1)),
                             top_k=int(rng.choice([0, 1, 5, 40])), presence_penalty=0.5, frequency_penalty=0.3,
                             banned_tokens=tuple(rng.integers(0, V, 3).tolist()),
                             seed=int(rng.integers(2**64, dtype=np.uint64)))
              for _ in range(B)]
    logits = (rng.standard_normal((B, V)) * 3).astype(np.float32)
    logits[3, 7] = np.nan
    counts = (rng.random((B, V)) < 0.05).astype(np.float32) * rng.integers(1, 3, (B, V)).astype(np.float32)
    rows = np_sampling.sampling_rows(params)
    banned = np_sampling.banned_mask(params, V)
    positions = rng.integers(0, 100, B).astype(np.int32)
    want = np_sampling.sample_rows(logits, counts, rows, banned, positions)
    got = dev.sample_rows(to_dev(logits), to_dev(counts), type(rows)(*(to_dev(a) for a in rows)),
                          to_dev(banned), to_dev(positions), **form)
    assert np.asarray(got).tolist() == want.tolist()
    packed = pack_allowed(rng.random((B, V)) < 0.5)
    np.testing.assert_array_equal(np.asarray(dev.disallowed(to_dev(banned), to_dev(packed))),
                                  banned | ~unpack_allowed(packed, V))
    np.testing.assert_allclose(np.asarray(dev.gumbel_noise(to_dev(rows.seed), to_dev(rows.seed_hi), to_dev(positions), V)),
                               np_sampling.gumbel_noise(rows.seed, rows.seed_hi, positions, V), rtol=1e-5, atol=1e-6)
    hashed = np.asarray(dev.lowbias32(to_dev(np.arange(2**32 - 1000, 2**32, dtype=np.uint32))))
    assert hashed.astype(np.uint32).tolist() == np_sampling.lowbias32(np.arange(2**32 - 1000, 2**32)).tolist()


def check_failed_step_fails_its_requests_and_engine_recovers(name, model, engine, monkeypatch):
    calls = {"n": 0}
    if name == "jax":
        real = engine.executables.call

        def flaky(key, *args):
            if key[0] == "step":
                calls["n"] += 1
                if calls["n"] == 3:  # lose the donated batch, as a mid-step failure would
                    for leaf in jax_leaves(args[1]):
                        leaf.delete()
                    raise RuntimeError("device fault")
            return real(key, *args)
        monkeypatch.setattr(engine.executables, "call", flaky)
    else:
        real = model.forward

        def flaky(tokens, state, full_output=False):
            if tokens.shape[1] == 1 and tokens.shape[0] == engine.bucket:
                calls["n"] += 1
                if calls["n"] == 3:
                    raise RuntimeError("device fault")
            return real(tokens, state, full_output)
        monkeypatch.setattr(model, "forward", flaky)
    requests = [Request(f"f{i}", [i + 1, 2, 3], SamplingParams(max_tokens=10, stop_tokens=())) for i in range(3)]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=4))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    failed = [r.id for r in requests if scheduler.results[r.id].finish_reason == "error"]
    assert failed and all("device fault" in scheduler.results[i].error for i in failed)
    monkeypatch.undo()
    later = Request("later", [9, 8, 7], SamplingParams(max_tokens=6, stop_tokens=()))
    scheduler.add(later)
    scheduler.run()
    assert scheduler.results["later"].tokens == solo_greedy(model, later.prompt_tokens, 6)


def jax_leaves(tree):
    import jax
    return jax.tree.leaves(tree)


def mass_above(z, top_k):
    """float64 [B, V]: the softmax mass (over each row's top-k survivors; top_k 0 = all) of the
    logits strictly above each token's, from a float64 sort and cumsum."""
    B, V = z.shape
    order = np.argsort(-z, axis=1, kind="stable")
    sorted_z = np.take_along_axis(z, order, axis=1).astype(np.float64)
    sorted_z[(top_k[:, None] > 0) & (np.arange(V)[None, :] >= top_k[:, None])] = -np.inf
    p = np.exp(sorted_z - sorted_z[:, :1])
    p /= p.sum(axis=1, keepdims=True)
    above = np.empty_like(p)
    np.put_along_axis(above, order, np.cumsum(p, axis=1) - p, axis=1)
    return above


@pytest.mark.parametrize("form, B", [("loop", 12), ("unrolled", 3), ("unrolled", 12), ("pallas-interpret", 3)])
@pytest.mark.parametrize("scale", [8.0, 0.5])  # peaked rows, flat rows
def test_jax_nucleus_mask_equals_numpy_sort_rule(scale, form, B):
    """rwkv_jax finds the top-k/top-p threshold by a radix search instead of a sort; the kept
    set must equal the numpy reference's sort-and-cumsum rule, ties at the threshold too."""
    import jax.numpy as jnp

    from rwkv_jax import sampling as dev

    rng = np.random.default_rng()
    Vbig = 4096
    z = (rng.standard_normal((B, Vbig)) * scale).astype(np.float32)
    z[0, :3] = z[0].max() + 1.0  # a three-way tie for the top
    z[1, 10:14] = -np.inf          # banned tokens
    top_k = rng.choice([0, 0, 1, 3, 50, 1000], B).astype(np.int32)
    top_p = rng.uniform(0.05, 1.0, B).astype(np.float32)
    top_p[2] = 1.0
    got = np.asarray(dev.nucleus_mask(jnp.asarray(z), jnp.asarray(top_k), jnp.asarray(top_p), dev.SearchForm(form)))
    want = np_sampling.nucleus_mask(z, top_k, top_p)
    # the two sum V float32 terms in different orders: a token whose mass above it is top_p to
    # within those sums' rounding may go either way (~1 % of such rows before this allowance)
    undecided = mass_above(z, top_k) - top_p[:, None]
    undecided = (np.abs(undecided) < 1e-5) & (top_p[:, None] < 1)  # top_p >= 1 keeps every survivor
    assert undecided.sum() <= B  # a boundary token or so a row, not a different rule
    assert ((got == want) | undecided).all(), np.argwhere(got != want)
    assert got[0, :3].all()
    assert not got[1, 10:14].any()
