"""Every failure carries its kind (``ErrorCode``) beside its message, and finish reasons are
``FinishReason`` members that read as their wire values; a bad sampling field is a
``SamplingFieldError`` naming the field."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from rwkv7_core.sampling import SamplingFieldError
from scheduler import ErrorCode, FinishReason, Request, SamplingParams, Scheduler, SchedulerConfig, generate
from tests.support.scheduler_engines import FakeEngine

V = 64


def test_each_failure_has_its_code():
    rng = np.random.default_rng()
    ok = [Request(f"ok{i}", rng.integers(1, 8, 3).tolist(), SamplingParams(max_tokens=int(rng.integers(2, 6))))
          for i in range(3)]
    bad_token = Request("bad_token", [int(rng.integers(V, 4 * V))], SamplingParams(max_tokens=3))
    bad_top_p = Request("bad_top_p", [1, 2], SamplingParams(max_tokens=3, top_p=float(rng.uniform(1.01, 5))))
    nan = Request("nan", [9] * 8, SamplingParams(max_tokens=5, stop_tokens=()))
    crash = Request("crash", [2, 13], SamplingParams(max_tokens=3))
    engine = FakeEngine(V, poison_token=9, poison_after=6, crash_token=13)
    outs = {o.id: o for o in generate(engine, [*ok, bad_token, bad_top_p, nan, crash], SchedulerConfig(max_batch=4))}
    expected = {"bad_token": ErrorCode.INVALID_REQUEST, "bad_top_p": ErrorCode.INVALID_REQUEST,
                "nan": ErrorCode.NONFINITE_LOGITS, "crash": ErrorCode.PREFILL_FAILED}
    for rid, code in expected.items():
        assert outs[rid].finish_reason is FinishReason.ERROR and outs[rid].error_code is code, outs[rid]
        assert outs[rid].error  # the message, for people
    for r in ok:
        assert outs[r.id].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert outs[r.id].error is None and outs[r.id].error_code is None


def test_a_failed_decode_step_is_an_engine_failure():
    scheduler = Scheduler(FakeEngine(V, fail_steps=[2]), SchedulerConfig(max_batch=2))
    for i in range(2):
        scheduler.add(Request(f"r{i}", [1 + i], SamplingParams(max_tokens=20, stop_tokens=())))
    scheduler.run()
    failed = [o for o in scheduler.results.values() if o.finish_reason == FinishReason.ERROR]
    assert failed and all(o.error_code is ErrorCode.ENGINE_FAILED for o in failed)


def test_finish_reasons_read_as_their_values():
    for reason in FinishReason:
        assert reason == reason.value and json.loads(json.dumps({"r": reason})) == {"r": reason.value}
        assert f"{reason}" == reason.value and pickle.loads(pickle.dumps(reason)) is reason
    assert {r.value for r in FinishReason} == {"length", "stop", "error", "cancelled"}


@pytest.mark.parametrize("field, value", [("top_p", 1.5), ("temperature", -1.0), ("top_k", -3), ("max_tokens", -1)])
def test_a_bad_sampling_field_is_named(field, value):
    rng = np.random.default_rng()
    value = value * float(rng.uniform(1, 3)) if isinstance(value, float) else value - int(rng.integers(0, 5))
    with pytest.raises(SamplingFieldError) as caught:
        SamplingParams(**{field: value}).validate(V)
    error = caught.value
    assert error.field == field and str(error).startswith(f"SamplingParams.{field}=") and str(error).endswith(error.why)
    again = pickle.loads(pickle.dumps(error))
    assert (again.field, again.why, str(again)) == (error.field, error.why, str(error))
