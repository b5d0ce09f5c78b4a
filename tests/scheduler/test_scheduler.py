"""Scheduling logic against the fast numpy FakeEngine."""
import json

import numpy as np
import pytest

from scheduler import Request, RequestState, SamplingParams, Scheduler, SchedulerConfig, bucket_ladder, generate
from tests.support.scheduler_engines import FakeEngine, reference_decode

V = 64


def random_requests(rng, n, *, sampled=False, max_tokens=(1, 25), prompt_len=(1, 12)):
    requests = []
    for i in range(n):
        params = SamplingParams(max_tokens=int(rng.integers(*max_tokens)), stop_tokens=())
        if sampled:
            params = params.replace(temperature=float(rng.uniform(0.3, 1.5)), top_p=float(rng.uniform(0.5, 1)),
                                    top_k=int(rng.integers(0, 10)), presence_penalty=float(rng.uniform(0, 1)),
                                    frequency_penalty=float(rng.uniform(0, 1)),
                                    penalty_decay=float(rng.uniform(0.9, 1)),
                                    banned_tokens=tuple(rng.integers(0, V, 3).tolist()),
                                    seed=int(rng.integers(2**32)))
        prompt = rng.integers(1, V, int(rng.integers(*prompt_len))).tolist()
        requests.append(Request(f"req{i}", prompt, params))
    return requests


def test_bucket_ladder():
    assert bucket_ladder(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert bucket_ladder(6) == (1, 2, 4, 6)
    assert SchedulerConfig(max_batch=5, buckets=[8, 2]).validated().buckets == (2, 8)
    with pytest.raises(ValueError, match="buckets"):
        SchedulerConfig(max_batch=16, buckets=[1, 8]).validated()
    with pytest.raises(ValueError, match="prefill_policy"):
        SchedulerConfig(prefill_policy="bogus").validated()


@pytest.mark.parametrize("sampled", [False, True])
def test_each_request_matches_its_solo_decode(sampled):
    rng = np.random.default_rng(7 + sampled)
    requests = random_requests(rng, 40, sampled=sampled)
    engine = FakeEngine(V, seed=3)
    outputs = generate(engine, requests, SchedulerConfig(max_batch=8))
    assert [o.id for o in outputs] == [r.id for r in requests]
    for r, o in zip(requests, outputs):
        assert o.tokens == reference_decode(FakeEngine(V, seed=3), r.prompt_tokens, r.params), r.id
        assert o.finish_reason == "length" and o.generated_tokens == r.params.max_tokens
    step_buckets = {e[1] for e in engine.events if e[0] == "step"}
    assert step_buckets <= {1, 2, 4, 8} and 8 in step_buckets


def test_seeded_sampling_same_at_any_max_batch():
    rng = np.random.default_rng(11)
    requests = random_requests(rng, 20, sampled=True)
    one = generate(FakeEngine(V), requests, SchedulerConfig(max_batch=1))
    eight = generate(FakeEngine(V), requests, SchedulerConfig(max_batch=8, buckets=[3, 8]))
    assert [o.tokens for o in one] == [o.tokens for o in eight]
    reseeded = [Request(r.id, r.prompt_tokens, r.params.replace(seed=r.params.seed + 1)) for r in requests]
    other = generate(FakeEngine(V), reseeded, SchedulerConfig(max_batch=8))
    assert [o.tokens for o in other] != [o.tokens for o in one]


def test_growth_then_one_shrink_per_bucket():
    # 8 requests, all admitted before any finishes; then one finishes every 10 steps.
    engine = FakeEngine(V, step_seconds=0.002)
    requests = [Request(f"r{i}", [1 + i, 2, 3], SamplingParams(max_tokens=10 * (i + 1), stop_tokens=()))
                for i in range(8)]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=8))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    switches = [(s.from_bucket, s.to_bucket, s.live) for s in scheduler.stats.switches]
    first_shrink = next(i for i, s in enumerate(switches) if s[1] < s[0])
    growth, shrinks = switches[:first_shrink], switches[first_shrink:]
    assert growth[0][0] == 0 and growth[-1][1] == 8
    assert all(a[1] < b[1] for a, b in zip(growth, growth[1:]))
    assert shrinks == [(8, 4, 4), (4, 2, 2), (2, 1, 1)]
    resizes = [e for e in engine.events if e[0] == "resize"]
    assert resizes[-3:] == [("resize", 8, 4, (4, 5, 6, 7)), ("resize", 4, 2, (2, 3)), ("resize", 2, 1, (1,))]
    for step in scheduler.stats.steps:
        assert step.live <= step.bucket
    assert all(scheduler.results[r.id].generated_tokens == r.params.max_tokens for r in requests)


def test_growth_when_admissions_need_it_and_user_buckets():
    engine = FakeEngine(V, step_seconds=0.001, prefill_seconds_per_token=0.002)
    requests = [Request(f"r{i}", [5] * 4, SamplingParams(max_tokens=30, stop_tokens=())) for i in range(5)]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=5, buckets=[2, 5]))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    assert {s.bucket for s in scheduler.stats.steps} <= {2, 5}
    assert [(s.from_bucket, s.to_bucket) for s in scheduler.stats.switches][:2] == [(0, 2), (2, 5)]


def test_decode_continues_while_a_prompt_prefills():
    engine = FakeEngine(V, step_seconds=0.001, prefill_seconds_per_token=0.002)
    requests = [Request("short", [1], SamplingParams(max_tokens=200, stop_tokens=())),
                Request("long", [2] * 60, SamplingParams(max_tokens=5, stop_tokens=()))]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=4))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    long_prefill = next(p for p in scheduler.stats.prefills if p.id == "long")
    during = [s for s in scheduler.stats.steps
              if long_prefill.time < s.time < long_prefill.time + long_prefill.seconds]
    assert len(during) >= 10  # ~120 ms of prefill, 1 ms steps
    assert scheduler.results["long"].tokens == reference_decode(FakeEngine(V), [2] * 60, requests[1].params)


def test_every_request_final_exactly_once_with_cancel_and_should_stop():
    rng = np.random.default_rng(5)
    requests = random_requests(rng, 30, max_tokens=(5, 40))
    engine = FakeEngine(V, step_seconds=0.0005)
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=4))
    for r in requests:
        scheduler.add(r)
    scheduler.add(Request("bad", [], SamplingParams()))
    scheduler.cancel("req29")  # still waiting: dropped at once
    finished = []
    drawn = {}

    def on_token(request_id, token):
        drawn[request_id] = drawn.get(request_id, 0) + 1
        if request_id == "req0" and drawn[request_id] == 3:
            scheduler.cancel("req0")

    scheduler.run(on_token=on_token, on_finish=finished.append, should_stop=lambda: len(finished) >= 10)
    ids = [o.id for o in finished]
    assert len(ids) == len(set(ids))
    results = {o.id: o for o in finished}
    assert results["req29"].finish_reason == "cancelled" and results["req29"].tokens == []
    assert results["req0"].finish_reason == "cancelled"
    assert results["req0"].tokens == reference_decode(FakeEngine(V), requests[0].prompt_tokens,
                                                                requests[0].params)[:3]
    assert results["bad"].finish_reason == "error"
    unstarted = scheduler.unstarted()
    assert unstarted and set(unstarted).isdisjoint(ids) and len(ids) + len(unstarted) == 31
    assert all(scheduler.state(i) is RequestState.WAITING for i in unstarted)
    # a second run finishes the rest; nothing is reported twice
    scheduler.run(on_finish=finished.append)
    ids = [o.id for o in finished]
    assert sorted(ids) == sorted([r.id for r in requests] + ["bad"])
    # results went only to on_finish; nothing per request is left, and cancelling a finished
    # or unknown id is a no-op
    assert scheduler.results == {} and all(scheduler.state(i) is None for i in ids)
    scheduler.cancel("req1")
    scheduler.cancel("no such id")
    scheduler.run()
    assert scheduler.stats.requests_finished == 31 and scheduler.stats.finished["cancelled"] >= 2
    results = {o.id: o for o in finished}
    for r in requests:
        out = results[r.id]
        assert out.finish_reason in ("length", "cancelled")
        if out.finish_reason == "length":
            assert out.tokens == reference_decode(FakeEngine(V), r.prompt_tokens, r.params)


def test_stop_tokens_and_strings():
    engine = FakeEngine(V)
    prompt = [3, 4, 5]
    free = reference_decode(FakeEngine(V), prompt, SamplingParams(max_tokens=30, stop_tokens=()))
    stop_at = free[5]
    first = free.index(stop_at)

    class CharTokenizer:  # token t -> chr(ord('a') + t % 26)
        def decode_bytes(self, tokens):
            return "".join(chr(97 + t % 26) for t in tokens).encode()

    text = CharTokenizer().decode_bytes(free).decode()
    stop_string = text[7:10]
    requests = [Request("default", prompt, SamplingParams(max_tokens=30)),
                Request("explicit", prompt, SamplingParams(max_tokens=30, stop_tokens=(stop_at,))),
                Request("string", prompt, SamplingParams(max_tokens=30, stop_tokens=(), stop=(stop_string,)))]
    out = {o.id: o for o in generate(engine, requests, SchedulerConfig(max_batch=4), tokenizer=CharTokenizer())}
    expected_default = free[:free.index(0)] if 0 in free else free
    assert out["default"].tokens == expected_default
    assert out["explicit"].tokens == free[:first] and out["explicit"].finish_reason == "stop"
    end = text.index(stop_string) + len(stop_string)
    assert out["string"].tokens == free[:end] and out["string"].finish_reason == "stop"
    no_tok = generate(FakeEngine(V), [Request("s", prompt, SamplingParams(stop=("x",)))])[0]
    assert no_tok.finish_reason == "error" and "tokenizer" in no_tok.error


@pytest.mark.parametrize("prompt, params, field", [
    ([1, V], SamplingParams(), "outside the vocabulary"),
    ([-1, 2], SamplingParams(), "outside the vocabulary"),
    ([], SamplingParams(), "empty"),
    ([1], SamplingParams(max_tokens=-1), "max_tokens"),
    ([1], SamplingParams(top_p=0.0), "top_p"),
    ([1], SamplingParams(top_p=1.5), "top_p"),
    ([1], SamplingParams(temperature=-0.1), "temperature"),
    ([1], {"max_tokens": 3, "tempreature": 1.0}, "tempreature"),
    ([1], SamplingParams(banned_tokens=(V + 3,)), "banned_tokens"),
    ([1], SamplingParams(stop_tokens=(V,)), "stop_tokens"),
    ([1.5], SamplingParams(), "integers"),
])
def test_invalid_request_fails_alone(prompt, params, field):
    good = Request("good", [1, 2], SamplingParams(max_tokens=5, stop_tokens=()))
    outs = generate(FakeEngine(V), [good, Request("bad", prompt, params)], SchedulerConfig(max_batch=2))
    assert outs[0].finish_reason == "length" and len(outs[0].tokens) == 5
    assert outs[1].finish_reason == "error" and field in outs[1].error and outs[1].tokens == []


def test_sampling_params_from_dict():
    assert SamplingParams.from_dict({"max_tokens": 3, "stop_tokens": [1, 2]}).stop_tokens == (1, 2)
    with pytest.raises(ValueError, match="bogus"):
        SamplingParams.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="penalty_decay"):
        SamplingParams.from_dict({"penalty_decay": 0})


def test_nonfinite_row_fails_alone():
    engine = FakeEngine(V, poison_token=9, poison_after=6, step_seconds=0.0005)
    requests = [Request(f"ok{i}", [1 + i, 2], SamplingParams(max_tokens=20, stop_tokens=())) for i in range(4)]
    requests.insert(2, Request("nan", [9, 1, 1], SamplingParams(max_tokens=20, stop_tokens=())))
    requests.append(Request("nan_now", [9] * 8, SamplingParams(max_tokens=20, stop_tokens=())))
    outs = {o.id: o for o in generate(engine, requests, SchedulerConfig(max_batch=8))}
    assert outs["nan"].finish_reason == "error" and "non-finite" in outs["nan"].error
    assert len(outs["nan"].tokens) == 3  # logits turn NaN once 6 tokens were seen
    assert outs["nan_now"].finish_reason == "error" and outs["nan_now"].tokens == []
    for r in requests:
        if r.id.startswith("ok"):
            assert outs[r.id].tokens == reference_decode(FakeEngine(V), r.prompt_tokens, r.params)


def test_engine_exceptions_fail_that_step_only():
    engine = FakeEngine(V, fail_steps=[3], crash_token=13)
    requests = [Request(f"r{i}", [1 + i], SamplingParams(max_tokens=30, stop_tokens=())) for i in range(2)]
    requests.append(Request("crash", [2, 13], SamplingParams(max_tokens=3)))
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=2))
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    res = scheduler.results
    assert res["crash"].finish_reason == "error" and "injected prefill crash" in res["crash"].error
    failed = [r.id for r in requests[:2] if res[r.id].finish_reason == "error"]
    assert failed and all("injected failure at step 3" in res[i].error for i in failed)
    # still usable: later requests complete and match their solo decode
    later = Request("later", [7, 8], SamplingParams(max_tokens=12, stop_tokens=()))
    scheduler.add(later)
    scheduler.run()
    assert res["later"].tokens == reference_decode(FakeEngine(V), later.prompt_tokens, later.params)
    with pytest.raises(ValueError, match="duplicate"):
        scheduler.add(later)


def test_prefix_cache_hits_equal_misses():
    rng = np.random.default_rng(3)
    system = rng.integers(1, V, 20).tolist()
    requests = [Request(f"q{i}", system + rng.integers(1, V, int(rng.integers(1, 6))).tolist(),
                        SamplingParams(max_tokens=8, stop_tokens=())) for i in range(6)]
    requests.append(Request("again", requests[0].prompt_tokens, requests[0].params))
    config = SchedulerConfig(max_batch=1, prefix_cache_bytes=1 << 20, prefix_block=16)
    scheduler = Scheduler(FakeEngine(V), config)
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    stats = scheduler.stats
    assert stats.prefix_misses == 1 and stats.prefix_hits == 6
    cached = {r.id: r.cached_tokens for r in stats.requests}
    assert cached["q3"] == 16 and cached["again"] == len(requests[0].prompt_tokens)
    misses = generate(FakeEngine(V), requests, SchedulerConfig(max_batch=1))
    assert [scheduler.results[r.id].tokens for r in requests] == [o.tokens for o in misses]


def test_prefix_cache_is_bounded_lru():
    from scheduler.prefix_cache import PrefixCache
    row = (np.zeros(10, np.float32),)  # 40 bytes
    cache = PrefixCache(100)
    cache.put([1, 2], row)
    cache.put([1, 2, 3], row)
    assert cache.longest_prefix([1, 2, 3, 4])[0] == 3
    assert cache.longest_prefix([1, 2, 9])[0] == 2  # refreshes [1, 2]
    cache.put([5], row)  # evicts the least recently used: [1, 2, 3]
    assert cache.bytes == 80 and cache.longest_prefix([1, 2, 3])[0] == 2
    cache.put([6], (np.zeros(30, np.float32),))  # bigger than the bound: not stored
    assert cache.longest_prefix([6]) == (0, None)


def test_max_tokens_zero_and_stats_json():
    engine = FakeEngine(V)
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=2, precompile=True))
    scheduler.add(Request("zero", [1], SamplingParams(max_tokens=0)))
    scheduler.add(Request("two", [1], SamplingParams(max_tokens=2, stop_tokens=())))
    scheduler.run()
    assert scheduler.results["zero"].tokens == [] and scheduler.results["zero"].finish_reason == "length"
    assert ("compile", (1, 2)) in engine.events
    d = json.loads(json.dumps(scheduler.stats.to_dict()))
    assert {c["what"] for c in d["compiles"]} == {"bucket 1", "bucket 2"}
    assert {r["id"] for r in d["recent"]["requests"]} == {"zero", "two"}
    steps = d["recent"]["steps"]
    assert steps and all(s["path"] == "fake" for s in steps)
    assert d["totals"]["requests"] == 2 and d["totals"]["generated_tokens"] == 2
    assert d["totals"]["decode_steps"] == len(steps) and sum(w["steps"] for w in d["timeline"]) == len(steps)
    two = scheduler.results["two"]
    assert two.arrival_time <= two.first_token_time <= two.finish_time
