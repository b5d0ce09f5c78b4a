"""Per-request initial and final states in the scheduler (FakeEngine): continuing from a
request's final state gives exactly the tokens of running everything in one go, under every
way a request can finish; prefix-cache keys include the state. (The varlen and mixed
policies, which FakeEngine lacks, are covered with the real engines in tests/integration.)"""
import numpy as np
import pytest

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from scheduler.request import InitialState
from tests.support.scheduler_engines import FakeEngine

V = 64


def _greedy(max_tokens, stop_tokens=()):
    return SamplingParams(max_tokens=max_tokens, stop_tokens=tuple(stop_tokens))


def _run_one(request, config=None):
    return generate(FakeEngine(V, seed=5), [request], config or SchedulerConfig(max_batch=4))[0]


@pytest.mark.parametrize("case", ["length", "stop_token", "first_token_length", "first_token_stop", "prefill_only"])
def test_continuing_from_the_final_state_equals_one_go(case):
    rng = np.random.default_rng()
    p1, p2 = rng.integers(1, V, 9).tolist(), rng.integers(1, V, 5).tolist()
    config = SchedulerConfig(max_batch=4)
    free = _run_one(Request("free", p1, _greedy(12)), config).tokens
    params = {"length": _greedy(12), "stop_token": _greedy(12, [free[4]]),
              "first_token_length": _greedy(1), "first_token_stop": _greedy(12, [free[0]]),
              "prefill_only": _greedy(0)}[case]
    first = _run_one(Request("a", p1, params, return_state=True), config)
    assert first.final_state is not None
    assert first.finish_reason == ("stop" if "stop" in case else "length")
    assert first.tokens == free[:{"length": 12, "stop_token": free.index(free[4]), "first_token_length": 1,
                                  "first_token_stop": 0, "prefill_only": 0}[case]]
    # the state has consumed the prompt and every emitted token, never the stop token
    expected_state = FakeEngine(V, seed=5).prefill(np.array(p1 + first.tokens))[0]
    np.testing.assert_array_equal(first.final_state[0], expected_state)
    again = _run_one(Request("b", p2, _greedy(10), initial_state=InitialState.of(first.final_state)), config)
    one_go = _run_one(Request("c", p1 + first.tokens + p2, _greedy(10)), config)
    assert again.tokens == one_go.tokens and len(again.tokens) == 10


def test_final_state_only_when_asked_and_successful():
    engine = FakeEngine(V, poison_token=7, poison_after=3)
    outs = generate(engine, [Request("plain", [1, 2, 3], _greedy(4)),
                             Request("bad", [7, 1, 2, 3], _greedy(4), return_state=True),
                             Request("zero", [1, 2], _greedy(0))])
    assert [o.final_state for o in outs] == [None, None, None]
    assert outs[1].finish_reason == "error" and outs[2].finish_reason == "length"


def test_prefix_cache_keys_include_the_initial_state():
    """Same tokens from two states (and from zeros) never share a cache entry: with the cache
    every request gives the tokens it gives without it."""
    rng = np.random.default_rng()
    engine = FakeEngine(V, seed=2)
    states = [InitialState.of(engine.to_host(engine.prefill(rng.integers(1, V, 6)))) for _ in range(2)]
    assert states[0].key != states[1].key
    assert InitialState.of(states[0].row).key == states[0].key
    prompt = rng.integers(1, V, 6).tolist()
    requests = [Request(f"r{i}-{j}", prompt + [j], _greedy(8), initial_state=s, return_state=True)
                for j in range(3) for i, s in enumerate(states + [None])]
    sched = Scheduler(FakeEngine(V, seed=2), SchedulerConfig(max_batch=1, prefix_cache_bytes=1 << 20,
                                                             prefix_block=4))
    for r in requests:
        sched.add(r)
    sched.run()
    cached = [sched.results[r.id] for r in requests]
    assert (sched.stats.prefix_misses, sched.stats.prefix_hits) == (3, 6)  # one miss per start
    plain = generate(FakeEngine(V, seed=2), requests, SchedulerConfig(max_batch=1))
    assert [o.tokens for o in cached] == [o.tokens for o in plain]
    for c, p in zip(cached, plain):
        np.testing.assert_array_equal(c.final_state[0], p.final_state[0])
    assert len({o.final_state[0].tobytes() for o in plain[:3]}) == 3  # the three starts really differ
