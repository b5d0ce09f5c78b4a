"""Compiling ahead (scheduler/ahead.py): an engine with Capability.COMPILES gets the buckets
it is about to need compiled on a thread of their own; a step whose bucket is still compiling
keeps a ready one instead of waiting; engines without the capability are untouched."""
import logging
import threading
import time

import numpy as np
import pytest

from rwkv7_core.engine import Capability
from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.ahead import neighbours, plan_buckets, shrink_path
from scheduler.config import bucket_for, bucket_ladder, choose_bucket
from scheduler.interface import SchedulerFailed
from tests.support.scheduler_engines import CompilingEngine, FakeEngine, reference_decode

V = 64
LADDER = (1, 2, 4, 8, 16, 32)


def test_choose_bucket_takes_the_wanted_bucket_or_the_nearest_ready_one():
    rng = np.random.default_rng()
    for _ in range(2000):
        current = int(rng.choice((0,) + LADDER))
        ready_set = {b for b in LADDER if rng.random() < 0.4}
        need = int(rng.integers(1, (current or 32) + 1))
        want = min(need + int(rng.integers(0, 8)), 32)
        usable = ready_set | ({current} if current else set())
        got = choose_bucket(need, want, current, LADDER, ready_set.__contains__)
        target = bucket_for(want, LADDER)
        assert got >= need
        if target in usable:
            assert got == target
        elif target < current:  # shrinking: the smallest usable bucket above the target
            assert got in usable and got == min(b for b in usable if target < b <= current)
        elif any(need <= b < target for b in usable):  # growing: the largest usable one below it
            assert got == max(b for b in usable if need <= b < target)
        elif any(b > target for b in usable):
            assert got == min(b for b in usable if b > target)
        else:  # nothing usable (no batch yet): the wanted one, compiled then
            assert got == target and current == 0


def test_a_smaller_ready_bucket_is_always_taken():
    # once a smaller bucket is ready, no step decodes in a bucket over twice its rows
    rng = np.random.default_rng()
    for _ in range(500):
        live = int(rng.integers(1, 33))
        got = choose_bucket(live, live, 32, LADDER, lambda b: True)
        assert got < 2 * live and got == bucket_for(live, LADDER)


def test_shrink_path_follows_the_rows_running_out():
    rng = np.random.default_rng()
    ladder = bucket_ladder(64)
    for _ in range(300):
        remaining = rng.integers(1, 40, int(rng.integers(1, 65)))
        path = shrink_path(remaining, ladder)
        expected = []
        for left in sorted(set(remaining.tolist())):
            live = int((remaining > left).sum())
            if live and (not expected or expected[-1] != bucket_for(live, ladder)):
                expected.append(bucket_for(live, ladder))
        assert path == expected and path == sorted(path, reverse=True)


def test_plan_buckets_orders_by_need():
    ladder = bucket_ladder(32)
    assert neighbours(8, ladder) == [4, 16] and neighbours(1, ladder) == [2] and neighbours(32, ladder) == [16]
    # no batch yet: the bucket the queued requests fill, after the one the first step wants
    # when that is less than half of it
    assert plan_buckets(0, 12, 24, np.array([], int), True, ladder) == [32]
    assert plan_buckets(0, 3, 24, np.array([], int), True, ladder) == [4, 32]
    # a batch of 24 decoding, nothing queued: where its rows run out, then the next smaller one
    plan = plan_buckets(32, 24, 24, np.array([3] * 20 + [9] * 3 + [30]), False, ladder)
    assert plan == [4, 1, 16]
    # requests queued beyond the batch: the bucket they grow it to comes before any shrink
    assert plan_buckets(8, 8, 20, np.array([], int), True, ladder) == [32, 4]
    # a server's batch: the next smaller and the next larger bucket
    assert plan_buckets(8, 7, 7, np.array([], int), True, ladder) == [4, 16]
    assert plan_buckets(8, 7, 7, np.array([], int), False, ladder) == [4]


def _run(engine, max_tokens, on_token=None, precompile=False):
    """Requests sharing one prompt (prefilled once: they enter the batch together) that finish at
    different times (no stop tokens); returns (scheduler, requests)."""
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, int(rng.integers(2, 6))).tolist()
    requests = [Request(f"r{i}", prompt, SamplingParams(max_tokens=int(n), stop_tokens=(), seed=int(rng.integers(2**31))))
                for i, n in enumerate(max_tokens)]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=8, precompile=precompile))
    scheduler.add_group(requests)
    scheduler.run(on_token=on_token)
    return scheduler, requests


def _check_tokens(scheduler, engine, requests):
    for r in requests:
        assert scheduler.results[r.id].finish_reason == "length"
        assert scheduler.results[r.id].tokens == reference_decode(engine, r.prompt_tokens, r.params)


def test_no_compile_engine_gets_no_thread_and_shrinks_as_before():
    engine = FakeEngine(V, step_seconds=0.002)
    assert Capability.COMPILES not in engine.capabilities
    threads = set()
    scheduler, requests = _run(engine, [4, 4, 4, 4, 12, 12, 30, 60],
                               on_token=lambda *_: threads.update(t.name for t in threading.enumerate()))
    assert "compile-ahead" not in threads
    assert [(s.from_bucket, s.to_bucket) for s in scheduler.stats.switches] == [(0, 8), (8, 4), (4, 2), (2, 1)]
    assert scheduler.stats.kept_steps == 0 and all(s.wanted == s.bucket for s in scheduler.stats.steps)
    _check_tokens(scheduler, engine, requests)


def test_a_bucket_still_compiling_is_not_waited_for():
    # buckets 1, 2 and 4 compile (in the compile thread) only once the last row has 290 tokens
    # left: until then every step keeps bucket 8, padded; then the batch shrinks, never waiting
    engine = CompilingEngine(V, step_seconds=0.005, compile_seconds=0.1, held=(1, 2, 4))
    released = []

    def on_token(request_id, _token):
        if request_id == "r7" and len(tokens.setdefault("r7", [])) == 10:
            for b in (1, 2, 4):
                engine.release(b)
            released.append(time.perf_counter())
        tokens.setdefault(request_id, []).append(_token)
    tokens: dict = {}
    scheduler, requests = _run(engine, [4, 4, 4, 4, 12, 12, 30, 300], on_token=on_token)
    _check_tokens(scheduler, engine, requests)
    stats = scheduler.stats
    steps = list(stats.steps)
    assert steps[0].bucket == 8 and steps[-1].bucket == 1
    kept = [s for s in steps if s.wanted != s.bucket]
    assert kept and all(s.wanted < s.bucket for s in kept) and stats.kept_steps == len(kept)
    held = [s for s in steps if s.time < released[0]]
    assert all(s.bucket == 8 for s in held)
    assert sum(s.wanted == 4 for s in held) >= 5  # 4 rows live from the 4th step to the 10th
    # the decode thread compiled at most the first bucket; every later compile ran ahead
    assert all(name == "compile-ahead" or buckets == (8,) for name, buckets in engine.compile_threads)
    assert all(s.compile_wait < 0.05 for s in stats.switches if s.from_bucket)  # a compile takes 0.1 s
    assert stats.compile_seconds_hidden >= 0.1 * 2
    assert stats.compile_seconds == pytest.approx(sum(stats.compile_seconds_by_thread.values()))
    assert {e.thread for e in stats.compiles} <= {"ahead", "decode"}
    # the decode thread's own compiles, and what it blocked on another thread's: at the first switch only
    own = sum(e.seconds for e in stats.compiles if e.thread == "decode")
    assert stats.compile_seconds_waited == pytest.approx(own + stats.blocked_seconds)
    assert stats.compile_seconds_waited <= own + stats.switches[0].compile_wait + 1e-9
    # a switch to a bucket that was ready waited for nothing, not even the look-up
    assert all(s.compile_wait == 0.0 for s in list(stats.switches)[1:]), stats.switches


def test_growing_holds_ready_rows_back_until_the_bigger_bucket_is_ready():
    # the batch starts with one row in bucket 1 while bucket 8 compiles (held); the rows that
    # arrive meanwhile wait READY instead of the decode thread waiting for the compile
    engine = CompilingEngine(V, step_seconds=0.004, held=(8,))
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=8, buckets=[1, 8]))
    rng = np.random.default_rng()
    first = Request("first", rng.integers(1, V, 3).tolist(), SamplingParams(max_tokens=60, stop_tokens=(), seed=1))
    later = [Request(f"later{i}", rng.integers(1, V, 3).tolist(), SamplingParams(max_tokens=5, stop_tokens=(), seed=i))
             for i in range(5)]
    scheduler.add(first)
    seen = []

    def on_token(request_id, _token):
        seen.append(request_id)
        if seen.count("first") == 2:
            for r in later:
                scheduler.add(r)
        if seen.count("first") == 20:
            engine.release(8)
    scheduler.run(on_token=on_token)
    _check_tokens(scheduler, engine, [first, *later])
    steps = list(scheduler.stats.steps)
    assert {s.bucket for s in steps} == {1, 8}
    assert any(s.bucket == 1 and s.wanted == 8 for s in steps)
    assert all(name == "compile-ahead" for name, buckets in engine.compile_threads if 8 in buckets)


def test_precompiled_buckets_shrink_at_once():
    engine = CompilingEngine(V, step_seconds=0.002)
    scheduler, requests = _run(engine, [4, 4, 4, 4, 12, 12, 30, 60], precompile=True)
    assert [(s.from_bucket, s.to_bucket) for s in scheduler.stats.switches] == [(0, 8), (8, 4), (4, 2), (2, 1)]
    assert scheduler.stats.kept_steps == 0
    _check_tokens(scheduler, engine, requests)


def test_a_failed_background_compile_is_logged_and_compiled_on_use(caplog):
    # bucket 4's compile fails once in the compile thread: logged, counted, and the decode
    # thread compiles it when the batch needs it (this time it works)
    class FailsOnce(CompilingEngine):
        def compile(self, buckets):
            if 4 in buckets and threading.current_thread().name == "compile-ahead":
                self.compile_threads.append((threading.current_thread().name, tuple(buckets)))
                raise RuntimeError("injected compile failure of bucket 4")
            return super().compile(buckets)
    engine = FailsOnce(V, step_seconds=0.004)
    with caplog.at_level(logging.WARNING, logger="scheduler.ahead"):
        scheduler, requests = _run(engine, [8, 8, 8, 8, 8, 30, 30, 30])
    _check_tokens(scheduler, engine, requests)
    assert scheduler.stats.ahead_failures >= 1
    assert any("bucket 4 failed" in r.getMessage() and "injected compile failure" in r.getMessage()
               for r in caplog.records)
    assert 4 in {s.bucket for s in scheduler.stats.steps}
    assert any(name != "compile-ahead" and 4 in buckets for name, buckets in engine.compile_threads)


def test_a_dead_compile_thread_ends_the_run():
    class Death(BaseException):
        pass

    class Dies(CompilingEngine):
        def compile(self, buckets):
            if threading.current_thread().name == "compile-ahead" and set(buckets) - {8}:
                raise Death("compile thread killed")
            return super().compile(buckets)
    engine = Dies(V, step_seconds=0.004)
    with pytest.raises(SchedulerFailed, match="compile-ahead thread died: Death: compile thread killed"):
        _run(engine, [5, 5, 5, 5, 200, 200, 200, 200])
