"""An engine fault over HTTP: the step's requests get a 500 with the message, the server
keeps serving; a scheduler or prefill thread that dies fails the requests it held with a
503 naming why, and /health says so (503) — never a silent hang. A real uvicorn server on
loopback, in this process, so the test can make the (torch, tiny) engine fail."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from rwkv7_apps.engines import load_engine  # noqa: E402
from rwkv7_apps.serve.cli import build_app  # noqa: E402
from rwkv7_apps.serve.job import Limits  # noqa: E402
from scheduler import Scheduler, SchedulerConfig  # noqa: E402
from scheduler.replicas.engine_guard import InjectedThreadDeath  # noqa: E402
from tests.rwkv7_apps.serve_harness import in_process_server  # noqa: E402


class FailingSteps:
    """An engine that raises in ``step`` while ``failures`` > 0 (everything else delegated)."""

    def __init__(self, engine):
        self._engine = engine
        self.failures = 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, tokens, positions):
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("injected device fault")
        return self._engine.step(tokens, positions)


class Dying:
    """An engine whose calls named in ``methods`` raise InjectedThreadDeath (not an
    Exception: nothing on the way catches it) once ``armed``."""

    def __init__(self, engine, methods: tuple[str, ...]):
        self._engine, self.methods, self.armed = engine, methods, False

    def __getattr__(self, name):
        attr = getattr(self._engine, name)
        if name not in self.methods:
            return attr

        def call(*args, **kwargs):
            if self.armed:
                raise InjectedThreadDeath(f"injected death in {name}")
            return attr(*args, **kwargs)
        return call


@pytest.fixture(scope="module")
def served(tiny_ckpt):
    engine = FailingSteps(load_engine("torch", tiny_ckpt, kernels="torch"))
    sched = Scheduler(engine, SchedulerConfig(max_batch=4))
    app, service = build_app(sched, "m", {"max_tokens": 8}, Limits(64, 16), lambda: True)
    with in_process_server(app, service) as url:
        yield engine, openai.OpenAI(base_url=url, api_key="x", max_retries=0)


def test_engine_fault_fails_that_steps_requests_only(served):
    engine, client = served
    common = dict(model="m", max_tokens=200, extra_body={"stop_token_ids": [], "return_token_ids": True})

    def one(prompt):
        try:
            return client.completions.create(prompt=prompt, **common)
        except openai.APIStatusError as e:
            return e

    engine.failures = 1
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, [[1, 2], [3], [4, 5, 6]]))
    failed = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert failed, results  # the step failed while at least one request was in it
    for e in failed:
        assert e.status_code == 500 and "injected device fault" in e.message
    for r in results:
        if not isinstance(r, openai.APIStatusError):
            assert len(r.choices[0].model_extra["token_ids"]) == 200
    again = client.completions.create(prompt=[7, 8], **{**common, "max_tokens": 5})
    assert len(again.choices[0].model_extra["token_ids"]) == 5  # the server keeps serving


@pytest.mark.parametrize("methods, reason", [(("step",), "InjectedThreadDeath: injected death in step"),
                                             (("prefill", "prefill_varlen"), "the prefill thread died")])
def test_a_dead_thread_fails_its_requests_with_503_and_health_says_why(tiny_ckpt, methods, reason):
    engine = Dying(load_engine("torch", tiny_ckpt, kernels="torch"), methods)
    sched = Scheduler(engine, SchedulerConfig(max_batch=4))
    app, service = build_app(sched, "m", {"max_tokens": 8}, Limits(64, 16), lambda: True)
    with in_process_server(app, service) as url:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        common = dict(model="m", max_tokens=50, extra_body={"stop_token_ids": []})
        assert client.completions.create(prompt=[1, 2], **common).choices[0].finish_reason == "length"
        engine.armed = True

        def one(prompt):
            with pytest.raises(openai.APIStatusError) as e:
                client.completions.create(prompt=prompt, **common)
            return e.value

        with ThreadPoolExecutor(3) as pool:
            errors = list(pool.map(one, [[1, 2], [3], [4, 5, 6]]))
        for e in errors:
            assert e.status_code == 503 and reason in e.message, e
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10)
        assert health.value.code == 503
        assert json.loads(health.value.read()) == {"status": "failed", "reason": service.outage.reason}
        assert reason in service.outage.reason
        assert one([7]).status_code == 503  # refused at once: nothing hangs
