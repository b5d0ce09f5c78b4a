"""How rwkv7-serve stops, as a supervisor and its clients see it: SIGTERM drains (admission
closed with 503, requests in flight finish within --shutdown-grace, the rest end with an
error — streams with an error event and [DONE] — then exit 0), and a scheduler thread that
dies fails its requests and ends the process (exit 1, one line on stderr). Real server
subprocesses (torch engine, tiny random model), real HTTP clients on loopback."""
from __future__ import annotations

import http.client
import json
import signal
import threading
import time

import pytest

from tests.rwkv7_apps.serve_harness import running_server

pytest.importorskip("torch")

SERVER = ["--random-model", "tiny", "--backend", "torch", "--kernels", "torch", "--max-batch", "4"]
GRACE = 2
NO_STOP = {"stop_token_ids": [], "return_token_ids": True}


class Client(threading.Thread):
    """One POST /v1/completions in a thread: ``events`` (arrival time, SSE data) of a stream,
    else ``status`` and ``body``; ``started`` is set at the first event or the answer."""

    def __init__(self, port: int, body: dict):
        super().__init__(daemon=True)
        self.port, self.body = port, body
        self.started = threading.Event()
        self.events: list[tuple[float, str]] = []
        self.status, self.answer = None, None

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(self.body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        self.status = response.status
        if self.body.get("stream"):
            for line in response:
                if line.startswith(b"data: "):
                    self.events.append((time.monotonic(), line[6:].decode().strip()))
                    self.started.set()
        else:
            self.answer = json.loads(response.read())
        conn.close()
        self.started.set()

    def finished(self) -> Client:
        self.join(30)
        assert not self.is_alive(), "the client still waits"
        return self


def _until(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _stream_tokens(events: list[tuple[float, str]]) -> list[int]:
    return [t for _, data in events for t in json.loads(data)["choices"][0]["token_ids"]]


def test_sigterm_drains_in_flight_requests_then_ends_the_rest_and_exits_0(tmp_path):
    with running_server(SERVER + ["--shutdown-grace", GRACE], tmp_path) as server:
        long_stream = Client(server.port, {"prompt": [1, 2, 3], "max_tokens": 60_000, "stream": True, **NO_STOP})
        long_plain = Client(server.port, {"prompt": [4, 5], "max_tokens": 60_000, **NO_STOP})
        long_stream.start()
        long_plain.start()
        assert long_stream.started.wait(30)
        _until(lambda: server.metric("rwkv7_live_batch") >= 2)  # the non-streamed one decodes too
        short = Client(server.port, {"prompt": [6], "max_tokens": 60, "stream": True, **NO_STOP})
        short.start()
        assert short.started.wait(30)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        _until(lambda: server.get("/health")[0] != 200)
        assert json.loads(server.get("/health")[1]) == {"status": "draining", "reason": "the server is shutting down"}
        status, text = server.post("/v1/completions", json.dumps({"prompt": [7], "max_tokens": 1}).encode())
        assert status == 503 and json.loads(text)["error"]["message"].endswith("shutting down"), text
        assert server.proc.wait(timeout=GRACE + 20) == 0, server.log_text()
    # the short stream ran on after the signal, to its end
    short.finished()
    assert short.events[-1][1] == "[DONE]" and short.events[-1][0] > signalled
    assert json.loads(short.events[-2][1])["choices"][0]["finish_reason"] == "length"
    assert len(_stream_tokens(short.events[:-1])) == 60
    # the long ones ended with a JSON error after the grace period
    long_stream.finished()
    assert long_stream.events[-1][1] == "[DONE]"
    error = json.loads(long_stream.events[-2][1])["error"]
    assert error["code"] == 503 and "--shutdown-grace 2 s" in error["message"]
    assert long_stream.events[-2][0] - signalled >= GRACE - 0.5
    long_plain.finished()
    assert long_plain.status == 503 and "--shutdown-grace 2 s" in long_plain.answer["error"]["message"]
    assert "Traceback" not in server.log_text()


def test_a_dead_scheduler_thread_fails_its_requests_and_ends_the_process(tmp_path, monkeypatch):
    monkeypatch.setenv("RWKV7_REPLICA_FAULT", "0:thread:20")  # the 21st decode step raises a BaseException
    with running_server(SERVER, tmp_path) as server:
        stream = Client(server.port, {"prompt": [1, 2], "max_tokens": 1000, "stream": True, **NO_STOP})
        stream.start()
        assert server.proc.wait(timeout=30) == 1, server.log_text()
    stream.finished()
    assert stream.events[-1][1] == "[DONE]"
    error = json.loads(stream.events[-2][1])["error"]
    assert error["code"] == 503 and "InjectedThreadDeath" in error["message"], error
    assert len(_stream_tokens(stream.events[:-2])) < 1000
    lines = [line for line in server.log_text().splitlines() if "ready:" not in line]
    assert lines == ["rwkv7-serve: fatal: the scheduler failed: InjectedThreadDeath: injected thread death "
                     "after 20 steps; exiting"], lines
