"""The scheduler's serving additions on the numpy FakeEngine: the continuous run that waits
for requests added from other threads, prefill-once groups (n choices) and queue sizes."""
from __future__ import annotations

import threading
import time

import numpy as np

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig, generate
from tests.support.scheduler_engines import FakeEngine


def test_serve_until_waits_for_requests_added_later_and_stops_when_told():
    engine = FakeEngine(step_seconds=0.001)
    sched = Scheduler(engine, SchedulerConfig(max_batch=4))
    stop, finished = threading.Event(), []
    runner = threading.Thread(target=sched.run, kwargs=dict(on_finish=finished.append, serve_until=stop.is_set))
    runner.start()
    rng = np.random.default_rng()
    try:
        for wave in range(3):  # idle gaps between waves: the run keeps waiting
            time.sleep(0.15)
            assert runner.is_alive()
            for i in range(3):
                sched.add(Request(f"w{wave}-{i}", rng.integers(1, 64, 5).tolist(),
                                  SamplingParams(max_tokens=4, stop_tokens=[])))
            deadline = time.monotonic() + 10
            while len(finished) < 3 * (wave + 1) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(finished) == 3 * (wave + 1)
        assert sched.queue_sizes() == {"waiting": 0, "prefill": 0, "ready": 0, "running": 0}
    finally:
        stop.set()
        runner.join(timeout=5)
    assert not runner.is_alive()
    assert all(o.finish_reason == "length" and len(o.tokens) == 4 for o in finished)


def test_group_prefills_once_and_each_choice_equals_its_seed_alone():
    rng = np.random.default_rng()
    prompt = rng.integers(1, 64, 7).tolist()
    seeds = rng.integers(0, 2**32, 3).tolist()
    # A flat distribution over 16 tokens: two seeds drawing the same choice is ~impossible
    # (at temperature 1 and 6 tokens the peaked FakeEngine repeated one about once in 100 runs).
    params = [SamplingParams(max_tokens=16, temperature=4.0, stop_tokens=[], seed=s) for s in seeds]
    engine = FakeEngine()
    sched = Scheduler(engine, SchedulerConfig(max_batch=4))
    sched.add_group([Request(f"c{i}", prompt, p) for i, p in enumerate(params)])
    sched.run()
    assert len(sched.stats.prefills) == 1  # one prefill call for the three choices
    forked = [sched.results[f"c{i}"].tokens for i in range(3)]
    alone = [generate(FakeEngine(), [Request("x", prompt, p)])[0].tokens for p in params]
    assert forked == alone and len({tuple(t) for t in forked}) == 3


def test_group_members_fail_or_cancel_alone():
    sched = Scheduler(FakeEngine(), SchedulerConfig(max_batch=4))
    good = SamplingParams(max_tokens=5, stop_tokens=[])
    sched.add_group([Request("a", [1, 2], good), Request("b", [1, 2], good.replace(top_p=2.0)),
                     Request("c", [1, 2], good)])
    sched.cancel("a")  # the leader: still prefilled for "c", then dropped
    sched.run()
    reasons = {k: sched.results[k].finish_reason for k in "abc"}
    assert reasons == {"a": "cancelled", "b": "error", "c": "length"}
    assert "top_p" in sched.results["b"].error
