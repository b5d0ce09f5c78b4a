"""A stop (``should_stop``, the batch job's SIGTERM) is honoured during a long prefill: a
SERIAL prompt runs in calls of at most SERIAL_CALL_TOKENS, the run ends within one call of
the stop with the long prompt unstarted, and a later run redoes it with exactly its result."""
from __future__ import annotations

import time

import numpy as np

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.prefill import SERIAL_CALL_TOKENS
from tests.support.scheduler_engines import FakeEngine, reference_decode

PER_TOKEN = 25e-6  # FakeEngine's prefill sleep: one call of SERIAL_CALL_TOKENS ~ 0.2 s


def test_a_stop_during_a_long_prefill_ends_the_run_within_one_call():
    rng = np.random.default_rng()
    engine = FakeEngine(prefill_seconds_per_token=PER_TOKEN)
    calls = []
    prefill = engine.prefill
    engine.prefill = lambda tokens, start=None: calls.append(len(tokens)) or prefill(tokens, start)
    params = SamplingParams(max_tokens=4, stop_tokens=())
    short = Request("short", rng.integers(1, 64, 3).tolist(), params)
    long = Request("long", rng.integers(1, 64, 2 * SERIAL_CALL_TOKENS + 7).tolist(), params)
    sched = Scheduler(engine, SchedulerConfig(max_batch=4, prefill_policy="serial"))
    sched.add(short)
    sched.add(long)
    stopped = {}

    def on_finish(out):
        sched.results[out.id] = out
        stopped.setdefault("at", time.perf_counter())  # the short one is done: stop now

    sched.run(on_finish=on_finish, should_stop=lambda: "at" in stopped)
    assert time.perf_counter() - stopped["at"] < 1.5 * SERIAL_CALL_TOKENS * PER_TOKEN + 0.2
    assert sched.unstarted() == ["long"] and "long" not in sched.results
    assert max(calls) <= SERIAL_CALL_TOKENS and sum(calls) < len(long.prompt_tokens)
    sched.run(on_finish=on_finish)
    for r in (short, long):
        assert sched.results[r.id].tokens == reference_decode(FakeEngine(), r.prompt_tokens, r.params), r.id
