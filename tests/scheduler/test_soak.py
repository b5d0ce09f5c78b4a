"""Soak: 300,000 requests through the scheduler in flat memory, each finished exactly once
(benchmarks/soak_bench.py runs a million), and the streaming percentiles within their stated
bound of the exact ones."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from scheduler import Scheduler, SchedulerConfig
from scheduler.sketch import RELATIVE_ERROR, LogHistogram
from tests.support.scheduler_engines import CountingEngine, rss_bytes, soak

N = 300_000
GROWTH_LIMIT = 15 * 2**20  # 58 bytes per request kept from N/10 to N: a leak of one small object shows


@pytest.mark.single_stack
def test_300k_requests_in_flat_memory():
    scheduler = Scheduler(CountingEngine(), SchedulerConfig(max_batch=256))
    rss = {}

    def measure(done):
        gc.collect()
        rss[done] = rss_bytes()

    finished = soak(scheduler, N, checkpoints=(N // 10, N), on_checkpoint=measure)
    assert (finished == 1).all()
    growth = rss[N] - rss[N // 10]
    assert growth <= GROWTH_LIMIT, f"RSS grew {growth / 2**20:.1f} MB from {N // 10:,} to {N:,} requests"
    stats = scheduler.stats
    assert stats.requests_finished == N and stats.finished == {"length": N}
    assert scheduler.results == {} and len(scheduler.unstarted()) == 0
    assert len(stats.timeline.points()) <= stats.timeline.max_points
    assert stats.ttft.count == N and stats.inter_token.count == stats.generated_tokens - N


def test_streaming_percentiles_match_exact_ones_within_the_bound():
    scheduler = Scheduler(CountingEngine(), SchedulerConfig(max_batch=64))
    n = 5_000
    finished = soak(scheduler, n, window=200)
    assert (finished == 1).all()
    stats = scheduler.stats
    step_seconds = np.array([s.seconds for s in stats.steps])
    assert len(step_seconds) == stats.decode_steps  # a small run keeps every record
    ttfts = np.array([r.ttft for r in stats.requests])
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
        for sketch, exact in ((stats.ttft, ttfts), (stats.step_seconds, step_seconds)):
            want = np.percentile(exact, 100 * q, method="lower")
            assert abs(sketch.quantile(q) - want) <= RELATIVE_ERROR * want


def test_log_histogram_bound_on_fresh_random_values():
    rng = np.random.default_rng()
    values = np.concatenate([rng.lognormal(-7, 2.5, 20_000), rng.uniform(1e-6, 10, 5_000), [0.0, 1e-12]])
    one, halves = LogHistogram(), [LogHistogram(), LogHistogram()]
    one.add_many(values)
    for v in values[::2]:
        halves[0].add(float(v))
    halves[1].add_many(values[1::2])
    halves[0].merge(halves[1])
    assert np.array_equal(one.counts, halves[0].counts) and one.count == values.size
    for q in np.linspace(0, 1, 201):
        want = np.percentile(values, 100 * q, method="lower")
        got = one.quantile(q)
        assert got == halves[0].quantile(q)
        assert abs(got - want) <= RELATIVE_ERROR * want or (want < one.min_value and got == 0.0)


def test_merged_stats_of_replicas_add_up_and_survive_pickling():
    import pickle

    parts = []
    for seed in range(3):
        scheduler = Scheduler(CountingEngine(), SchedulerConfig(max_batch=16))
        soak(scheduler, 300 + 100 * seed, window=40)
        parts.append(pickle.loads(pickle.dumps(scheduler.stats)))
    merged = type(parts[0]).merged(parts)
    assert merged.requests_finished == sum(p.requests_finished for p in parts) == 1200
    assert merged.decode_tokens == sum(p.decode_tokens for p in parts)
    assert merged.ttft.count == 1200 and merged.ttft.max == max(p.ttft.max for p in parts)
    assert sum(w.steps for w in merged.timeline.points()) == merged.decode_steps
    times = [s.time for s in merged.steps]
    assert times == sorted(times)
    before = parts[0].steps[0].time
    parts[0].shift_times(10.0)
    assert parts[0].steps[0].time == before + 10.0 and parts[0].timeline.points()[0].start >= before + 10.0
