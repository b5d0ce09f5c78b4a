"""An engine fault over HTTP: the step's requests get a 500 with the message, the server
keeps serving. A real uvicorn server on loopback, in this process, so the test can make
the (torch, tiny) engine fail one step."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("torch")

from rwkv7_apps.engines import load_engine  # noqa: E402
from rwkv7_apps.serve.cli import build_app  # noqa: E402
from rwkv7_apps.serve.generation import Limits  # noqa: E402
from scheduler import Scheduler, SchedulerConfig  # noqa: E402
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
