"""A prefill thread that dies ends the run with a RuntimeError naming why, in a serving run
and a batch run alike — never a run that waits forever for prompts nobody prefills (issue
30: an exception past the engine call used to end the worker silently)."""
from __future__ import annotations

import threading

import pytest

from scheduler import Request, SamplingParams, Scheduler, SchedulerConfig
from tests.support.scheduler_engines import FakeEngine


class Death(BaseException):
    """Not an Exception: nothing on the way catches it."""


@pytest.mark.parametrize("serving", [False, True])
def test_a_dead_prefill_thread_ends_the_run_with_its_reason(serving):
    engine = FakeEngine()

    def die(*args, **kwargs):
        raise Death("prefill went away")

    engine.prefill = die
    sched = Scheduler(engine, SchedulerConfig(max_batch=4, prefill_policy="serial"))
    sched.add(Request("a", [1, 2, 3], SamplingParams(max_tokens=4, stop_tokens=[])))
    raised = []

    def run():
        try:
            sched.run(on_finish=lambda out: None, serve_until=(lambda: False) if serving else None)
        except RuntimeError as e:
            raised.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive(), "the run hangs"
    assert [str(e) for e in raised] == ["the prefill thread died: Death: prefill went away"]
    assert isinstance(raised[0].__cause__, Death)
