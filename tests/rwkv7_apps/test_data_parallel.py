"""ReplicaSet in-process on the scheduler's numpy FakeEngine: replicas give the same results
as one scheduler, every id exactly once, whether a replica's engine keeps raising, its
thread dies, or one step fails once; new requests go to the least loaded replica, a
conversation's next turn to its previous turn's replica unless that is much busier; a run
that ends joins the replica threads, and one stuck in its engine is reported."""
from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from scheduler.replicas.build import build_replica_set
from scheduler.replicas.engine_guard import Fault
from scheduler.replicas.replica_set import AFFINITY_SLACK_TOKENS, AllReplicasFailed, ReplicaSet
from tests.support.scheduler_engines import FakeEngine

CONFIG = SchedulerConfig(max_batch=4)


def _requests(seed: int, n: int = 40) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(f"q{i}", rng.integers(1, 64, size=int(rng.integers(1, 9))).tolist(),
                    SamplingParams(max_tokens=int(rng.integers(1, 20)), temperature=1.0, seed=int(rng.integers(2**31))))
            for i in range(n)]


def _engine(**kwargs) -> FakeEngine:
    return FakeEngine(vocab_size=64, seed=5, step_seconds=0.001, **kwargs)


def _single(requests) -> dict[str, list[int]]:
    sched = Scheduler(_engine(), CONFIG)
    for r in requests:
        sched.add(r)
    sched.run()
    return {i: out.tokens for i, out in sched.results.items()}


def _drive(rset: ReplicaSet, requests, window: int = 8) -> list:
    """Stream requests through a bounded window, as rwkv7-generate does; returns the outputs."""
    todo, outputs = iter(requests), []

    def admit():
        while len(rset.unstarted()) < window:
            r = next(todo, None)
            if r is None:
                return
            rset.add(r)

    def on_finish(out):
        outputs.append(out)
        admit()

    admit()
    rset.run(on_finish=on_finish)
    return outputs


def _check_exactly_once(outputs, requests, expected) -> None:
    ids = [o.id for o in outputs]
    assert sorted(ids) == sorted(r.id for r in requests) and len(set(ids)) == len(ids)
    for o in outputs:
        assert o.finish_reason in ("length", "stop") and o.tokens == expected[o.id], o


def test_replicas_match_one_scheduler_and_all_serve():
    requests = _requests(1)
    rset = build_replica_set([_engine() for _ in range(3)], ["a", "b", "c"], CONFIG)
    outputs = _drive(rset, requests)
    _check_exactly_once(outputs, requests, _single(requests))
    served = [r.requests for r in rset.replicas]
    assert sum(served) == len(requests) and min(served) > 0
    assert all(r.failed is None and not r.thread.is_alive() for r in rset.replicas)


@pytest.mark.parametrize("kind", ["engine", "thread"])
def test_a_failing_replica_is_taken_out_and_its_requests_rerun(kind):
    requests = _requests(2)
    messages = []
    rset = build_replica_set([_engine(), _engine()], ["a", "b"], CONFIG, fault=Fault(1, kind, 5))
    rset.notify = messages.append
    outputs = _drive(rset, requests)
    _check_exactly_once(outputs, requests, _single(requests))
    good, bad = rset.replicas
    assert bad.failed is not None and good.failed is None
    assert re.search(r"raised [3-9] times in a row" if kind == "engine" else "thread died", bad.failed)
    assert good.requests + bad.requests == len(requests) and good.requests > bad.requests
    assert any("replica 1 (b) taken out" in m for m in messages)


def test_one_failed_step_is_retried_without_taking_the_replica_out():
    requests = _requests(3, n=24)
    engines = [_engine(), _engine(fail_steps=[4])]
    rset = build_replica_set(engines, ["a", "b"], CONFIG)
    outputs = _drive(rset, requests)
    _check_exactly_once(outputs, requests, _single(requests))
    assert rset.replicas[1].guard.raised == 1 and all(r.failed is None for r in rset.replicas)


def test_every_replica_failing_raises_with_the_reasons():
    rset = build_replica_set([_engine(), _engine()], ["a", "b"], CONFIG, fault=Fault(0, "thread", 0))
    rset.replicas[1].failed = "marked failed by the test"
    rset.notify = lambda m: None
    for r in _requests(4, n=6):
        rset.add(r)
    with pytest.raises(AllReplicasFailed, match="replica 1 \\(b\\): marked failed by the test"):
        rset.run()


def test_new_requests_go_to_the_least_loaded_replica():
    rset = build_replica_set([_engine(), _engine()], ["a", "b"], CONFIG)
    big = Request("big", list(range(1, 41)), SamplingParams(max_tokens=60))  # 100 tokens of work
    rset.add(big)
    for i in range(4):  # 10 tokens each: all four fit beside the big one on the other replica
        rset.add(Request(f"s{i}", [1, 2, 3, 4], SamplingParams(max_tokens=6)))
    assert [r.work for r in rset.replicas] == [100, 40]
    rset.add(Request("s4", [1, 2, 3, 4], SamplingParams(max_tokens=6)))
    rset.add(Request("big2", list(range(1, 41)), SamplingParams(max_tokens=60)))
    assert [r.work for r in rset.replicas] == [100, 150]
    rset.run()
    assert [r.work for r in rset.replicas] == [0, 0] and [r.requests for r in rset.replicas] == [1, 6]


def test_a_conversation_turn_follows_its_replica_unless_much_busier():
    rng = np.random.default_rng()
    rset = build_replica_set([_engine(), _engine()], ["a", "b"], CONFIG)
    first = {c: Request(c, rng.integers(1, 64, 6).tolist(), SamplingParams(max_tokens=5, stop_tokens=[]))
             for c in ("A", "B")}
    for r in first.values():
        rset.add(r)
    rset.run()
    assert [r.requests for r in rset.replicas] == [1, 1]  # fresh ones spread (ties: fewest routed)
    history = {c: list(r.prompt_tokens) + rset.results[c].tokens for c, r in first.items()}
    rset.add(Request("fresh", [1, 2, 3], SamplingParams(max_tokens=7)))  # replica 0: 10 tokens of work
    rset.add(Request("A2", history["A"] + [9], SamplingParams(max_tokens=3)))  # back to replica 0 all the same
    assert [r.work for r in rset.replicas] == [10 + 12 + 3, 0]
    long = AFFINITY_SLACK_TOKENS + 100
    rset.add(Request("A3", history["A"][:6] + [7], SamplingParams(max_tokens=long)))  # its prompt: kept too
    rset.add(Request("B2", history["B"] + [5, 6], SamplingParams(max_tokens=2)))
    assert [r.work for r in rset.replicas] == [25 + 7 + long, 13 + 2]
    rset.add(Request("A4", history["A"] + [8], SamplingParams(max_tokens=1)))  # replica 0 is much busier
    assert [r.work for r in rset.replicas] == [25 + 7 + long, 15 + 12 + 1]
    assert rset.affinity_routes == {"kept": 3, "moved": 1}


def test_a_set_runs_again_after_a_stop():
    requests = _requests(5, n=20)
    rset = build_replica_set([_engine(), _engine()], ["a", "b"], CONFIG)
    for r in requests:
        rset.add(r)
    outputs = []

    def on_finish(out):
        outputs.append(out)

    rset.run(on_finish=on_finish, should_stop=lambda: len(outputs) >= 3)
    left = rset.unstarted()
    assert 3 <= len(outputs) < len(requests) and len(outputs) + len(left) == len(requests)
    rset.run(on_finish=on_finish)
    _check_exactly_once(outputs, requests, _single(requests))


class StuckInPrefill(FakeEngine):
    """A FakeEngine whose prefill calls ``entered()`` and then waits for ``release``."""

    def __init__(self, entered):
        super().__init__(vocab_size=64, seed=5)
        self.entered, self.release = entered, threading.Event()

    def prefill(self, tokens, start=None):
        self.entered()
        self.release.wait()
        return super().prefill(tokens, start)


def test_closing_reports_a_thread_stuck_in_its_engine():
    """Both replicas are marked failed from inside their engine's prefill, so the run ends
    (every replica failed) while both threads are still inside the engine."""
    def fail(i):
        def entered():
            rset.replicas[i].failed = "marked failed by the test"
        return entered

    rset = build_replica_set([StuckInPrefill(fail(0)), StuckInPrefill(fail(1))], ["a", "b"], CONFIG)
    messages = []
    rset.notify, rset.join_seconds = messages.append, 0.2
    for r in _requests(6, n=4):
        rset.add(r)
    with pytest.raises(AllReplicasFailed):
        rset.run()
    assert messages == [f"replica {i} ({d}): its thread did not end within 0.2 s of closing the replica set"
                        for i, d in enumerate("ab")]
    for r in rset.replicas:
        r.guard.engine.release.set()
        r.thread.join(10)
        assert not r.thread.is_alive()
