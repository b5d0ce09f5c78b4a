"""The turn-boundary state cache (``SchedulerConfig.turn_cache``) on the numpy FakeEngine: a
finished request's final state is kept under exactly the tokens it consumed, the next turn
prefills only what is new and draws what a cold run draws; forks keep their own states;
cancelled and failed requests keep none; entries age out by bytes, least recently used
first. The radix index agrees with a brute-force search."""
import numpy as np

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from scheduler.prefix_disk import DiskPrefixStore
from scheduler.token_radix import TokenRadix
from tests.support.scheduler_engines import FakeEngine

V = 64
STATE_BYTES = (8 + 2) * 8  # FakeEngine's state row (hidden 8 + 2, float64); a finished row has no logits


def _greedy(max_tokens, stop_tokens=()):
    return SamplingParams(max_tokens=max_tokens, stop_tokens=tuple(stop_tokens))


def _run(scheduler, requests):
    for r in requests:
        scheduler.add(r)
    scheduler.run()
    return [scheduler.results.pop(r.id) for r in requests]


def test_radix_index_matches_brute_force():
    rng = np.random.default_rng()
    radix, members = TokenRadix(), set()
    for _ in range(400):
        key = tuple(rng.integers(0, 4, int(rng.integers(1, 9))).tolist())  # small alphabet: shared prefixes
        if rng.random() < 0.35 and members:
            key = sorted(members)[int(rng.integers(len(members)))]
            radix.remove(key)
            members.discard(key)
        else:
            radix.add(key)
            members.add(key)
        query = tuple(rng.integers(0, 4, int(rng.integers(0, 12))).tolist())
        best = max((len(m) for m in members if query[:len(m)] == m), default=0)
        assert radix.longest_prefix(query) == best and len(radix) == len(members)


def test_next_turn_prefills_only_what_is_new_and_equals_a_cold_run():
    rng = np.random.default_rng()
    prompts = [rng.integers(1, V, int(rng.integers(5, 40))).tolist() for _ in range(3)]
    free = generate(FakeEngine(V), [Request(f"f{i}", p, _greedy(10)) for i, p in enumerate(prompts)])
    first = free[1].tokens[0]
    stop = next(t for t in free[1].tokens[1:] if t != first)  # stops after >= 1 consumed token
    turn1 = [Request("length", prompts[0], _greedy(10)), Request("stop_token", prompts[1], _greedy(10, [stop])),
             Request("one", prompts[2], _greedy(1))]
    scheduler = Scheduler(FakeEngine(V), SchedulerConfig(max_batch=4, prefix_cache_bytes=1 << 20, prefix_block=16))
    firsts = _run(scheduler, turn1)
    assert [o.finish_reason for o in firsts] == ["length", "stop", "length"]
    assert scheduler.stats.turn_states == 2  # "one" consumed nothing beyond its prompt
    turn2, expect_cached = [], []
    for r, out in zip(turn1, firsts):
        new = rng.integers(1, V, int(rng.integers(1, 20))).tolist()
        history = list(r.prompt_tokens) + out.tokens
        turn2.append(Request(r.id + "-2", history + new, _greedy(8)))
        expect_cached.append(len(history) - (out.stop_token is None))  # the last drawn token was never fed
    # a prompt equal to a finished state's key: that row has no logits, so one token shorter is used
    equal = list(prompts[0]) + firsts[0].tokens[:-1]
    turn2.append(Request("equal", equal, _greedy(8)))
    expect_cached.append(len(prompts[0]))
    seconds = _run(scheduler, turn2)
    assert [o.cached_tokens for o in seconds] == expect_cached
    cold = generate(FakeEngine(V), turn2)
    assert [o.tokens for o in seconds] == [o.tokens for o in cold]
    stats = scheduler.stats
    assert stats.prefix_hit_tokens == sum(expect_cached)
    assert stats.prefill_tokens == sum(len(p) for p in prompts) + sum(
        len(r.prompt_tokens) - c for r, c in zip(turn2, expect_cached))


def test_turn_cache_off_keeps_no_final_states():
    config = SchedulerConfig(max_batch=2, prefix_cache_bytes=1 << 20, turn_cache=False)
    scheduler = Scheduler(FakeEngine(V), config)
    out = _run(scheduler, [Request("a", [1, 2, 3], _greedy(6))])[0]
    again = _run(scheduler, [Request("b", [1, 2, 3] + out.tokens + [4], _greedy(2))])[0]
    assert scheduler.stats.turn_states == 0 and again.cached_tokens == 3


def test_forks_keep_their_own_states_and_cancel_or_error_keep_none():
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, 12).tolist()
    sampled = SamplingParams(max_tokens=12, stop_tokens=(), temperature=1.5)
    group = [Request(f"fork{k}", prompt, sampled.replace(seed=k)) for k in range(3)]
    scheduler = Scheduler(FakeEngine(V), SchedulerConfig(max_batch=4, prefix_cache_bytes=1 << 20))
    scheduler.add_group(group)
    scheduler.run()
    forks = [scheduler.results.pop(r.id) for r in group]
    assert len({tuple(f.tokens) for f in forks}) > 1  # the seeds drew different continuations
    assert scheduler.stats.turn_states == 3
    for k, fork in enumerate(forks):
        nxt = Request(f"next{k}", prompt + fork.tokens + [5, 6], _greedy(6))
        got = _run(scheduler, [nxt])[0]
        assert got.cached_tokens == len(prompt) + len(fork.tokens) - 1
        assert got.tokens == generate(FakeEngine(V), [nxt])[0].tokens
    # cancelled mid-decode, failed in prefill: nothing kept
    prompt = [t if t != 13 else 14 for t in prompt]
    scheduler = Scheduler(FakeEngine(V, crash_token=13, step_seconds=0.002),
                          SchedulerConfig(max_batch=4, prefix_cache_bytes=1 << 20))
    scheduler.add(Request("cancelled", prompt + [7], _greedy(500)))
    scheduler.add(Request("crash", prompt + [13], _greedy(5)))
    tokens = []
    scheduler.run(on_token=lambda rid, t: (tokens.append(t), len(tokens) == 3 and scheduler.cancel(rid)))
    assert scheduler.results["cancelled"].finish_reason == "cancelled"
    assert scheduler.results["crash"].finish_reason == "error"
    assert scheduler.stats.turn_states == 0


def test_final_states_age_out_by_bytes_least_recently_used_first():
    rng = np.random.default_rng()
    prompts = [rng.integers(1, V, 6).tolist() for _ in range(3)]
    # room for three finished states; a prompt's row (with logits) is larger than the whole budget
    scheduler = Scheduler(FakeEngine(V), SchedulerConfig(max_batch=1, prefix_cache_bytes=3 * STATE_BYTES))
    outs = [_run(scheduler, [Request(f"c{i}", p, _greedy(5))])[0] for i, p in enumerate(prompts)]
    histories = [p + o.tokens for p, o in zip(prompts, outs)]
    touch = _run(scheduler, [Request("touch0", histories[0] + [1], _greedy(1))])[0]  # c0 is now most recent
    assert touch.cached_tokens == len(histories[0]) - 1
    _run(scheduler, [Request("c3", rng.integers(1, V, 6).tolist(), _greedy(5))])  # evicts c1, the oldest
    hits = [_run(scheduler, [Request(f"again{i}", h + [2], _greedy(1))])[0].cached_tokens
            for i, h in enumerate(histories)]
    assert hits == [len(histories[0]) - 1, 0, len(histories[2]) - 1]


def test_final_states_spill_to_the_disk_tier_and_never_load_for_another_model(tmp_path):
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, 10).tolist()

    def scheduler(fingerprint):
        return Scheduler(FakeEngine(V), SchedulerConfig(max_batch=1, prefix_cache_bytes=0),  # disk tier only
                         prefix_store=DiskPrefixStore(tmp_path, 1 << 20, fingerprint))

    first = _run(scheduler("model-a"), [Request("t1", prompt, _greedy(6))])[0]
    nxt = Request("t2", prompt + first.tokens + [3, 4], _greedy(5))
    other = _run(scheduler("model-b"), [nxt])[0]           # another model's files: never used
    assert other.cached_tokens == 0
    again = _run(scheduler("model-a"), [nxt])[0]            # a fresh scheduler of the same model
    assert again.cached_tokens == len(prompt) + len(first.tokens) - 1
    assert again.tokens == other.tokens == generate(FakeEngine(V), [nxt])[0].tokens
