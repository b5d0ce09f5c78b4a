"""The batch shrinks to a bucket not compiled yet only when the decode time it saves exceeds
what compiling that bucket costs (``scheduler.config.shrink_pays``); compiled buckets and
engines that compile nothing shrink as always."""
import numpy as np
import pytest

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.config import shrink_pays
from tests.support.scheduler_engines import FakeEngine, reference_decode

V = 64


def test_shrink_pays_weighs_saved_steps_against_the_compile():
    rng = np.random.default_rng()
    for _ in range(200):
        current = int(rng.choice([2, 4, 8, 16, 32, 64]))
        target = current // int(rng.choice([2, 4])) or 1
        step, steps, cost = float(rng.uniform(1e-4, 1e-1)), int(rng.integers(1, 5000)), float(rng.uniform(0.01, 30))
        saving = step * (1 - target / current) * steps
        assert shrink_pays(current, target, step, steps, cost) == (saving > cost)
        assert shrink_pays(current, target, step, steps, 0.0)        # nothing to compile
        assert shrink_pays(current, target, None, steps, cost)       # step time not measured yet


def _run(engine, max_tokens, precompile=False):
    """Eight requests sharing one prompt (prefilled once: all enter bucket 8 together) that
    finish at different times; returns (scheduler, requests)."""
    rng = np.random.default_rng()
    prompt = rng.integers(1, V, int(rng.integers(2, 6))).tolist()
    requests = [Request(f"r{i}", prompt, SamplingParams(max_tokens=int(n), stop_tokens=(), seed=int(rng.integers(2**31))))
                for i, n in enumerate(max_tokens)]
    scheduler = Scheduler(engine, SchedulerConfig(max_batch=8, precompile=precompile))
    scheduler.add_group(requests)
    scheduler.run()
    return scheduler, requests


def _buckets(scheduler):
    return [s.bucket for s in scheduler.stats.steps]


@pytest.mark.parametrize("compile_seconds", [0.0, 1e-6])
def test_cheap_compiles_shrink_as_rows_finish(compile_seconds):
    # steps_left x step time x dropped share >> 1e-6 s: every shrink pays
    engine = FakeEngine(V, step_seconds=0.002, compile_seconds=compile_seconds)
    scheduler, requests = _run(engine, [4, 4, 4, 4, 12, 12, 30, 60])
    assert _buckets(scheduler)[0] == 8
    assert [(s.from_bucket, s.to_bucket) for s in scheduler.stats.switches] == [(0, 8), (8, 4), (4, 2), (2, 1)]
    for r in requests:
        assert scheduler.results[r.id].tokens == reference_decode(engine, r.prompt_tokens, r.params)


def test_a_shrink_that_cannot_repay_its_compile_is_skipped():
    # 60 steps at most are left, each 2 ms: a 100 s compile never pays; the batch stays at 8
    engine = FakeEngine(V, step_seconds=0.002, compile_seconds=100.0)
    scheduler, requests = _run(engine, [4, 4, 4, 4, 12, 12, 30, 60])
    assert set(_buckets(scheduler)) == {8}
    assert [e for e in engine.events if e[0] == "compile"] == [("compile", (8,))]
    for r in requests:  # staying in the bigger bucket changes no token
        assert scheduler.results[r.id].tokens == reference_decode(engine, r.prompt_tokens, r.params)


def test_compiled_buckets_always_shrink():
    engine = FakeEngine(V, step_seconds=0.002, compile_seconds=100.0)
    scheduler, _ = _run(engine, [4, 4, 4, 4, 12, 12, 30, 60], precompile=True)
    assert [(s.from_bucket, s.to_bucket) for s in scheduler.stats.switches] == [(0, 8), (8, 4), (4, 2), (2, 1)]


def test_a_long_tail_pays_for_the_compile():
    # the last row has ~400 steps left at 8 rows' step time: shrinking to 1 saves ~0.7 s > 0.2 s
    engine = FakeEngine(V, step_seconds=0.002, compile_seconds=0.2)
    scheduler, _ = _run(engine, [3, 3, 3, 3, 3, 3, 3, 400])
    switches = [(s.from_bucket, s.to_bucket) for s in scheduler.stats.switches]
    assert switches[0] == (0, 8) and switches[-1][1] == 1 and len(switches) == 2
