"""The server under hostile clients (issue 37, items 2, 3, 5, 6 and 9), on one real
``rwkv7-serve --random-model tiny-world`` with small limits set by options: idle and
slowloris sockets are closed and never lock /health out; a /tokenize body is tokenized off
the event loop; a reply's size is bounded before work starts; the prefix cache is no oracle
across cache salts, and /metrics needs the key; Responses metadata is bounded. Beside every attack, good requests keep their exact greedy
tokens."""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import numpy as np
import pytest

from tests.rwkv7_apps.serve_harness import running_server

KEY = "k-" + "x" * 20
AUTH = {"Authorization": f"Bearer {KEY}"}
CAP, HEADER_TIMEOUT, REPLY_ENTRIES = 24, 1.0, 5000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--random-model", "tiny-world", "--max-batch", 4, "--api-key", KEY, "--max-connections", CAP,
            "--header-timeout", HEADER_TIMEOUT, "--keep-alive-timeout", 1, "--max-reply-entries", REPLY_ENTRIES]
    with running_server(args, tmp_path_factory.mktemp("hostile-server")) as s:
        yield s


def _greedy(server, prompt: list[int], **extra) -> dict:
    status, text = server.post("/v1/completions", json.dumps(
        {"prompt": prompt, "max_tokens": 4, "temperature": 0, "return_token_ids": True, "stop_token_ids": [],
         **extra}).encode(), AUTH)
    assert status == 200, text
    body = json.loads(text)
    usage = body["usage"]["prompt_tokens_details"]
    return {"tokens": body["choices"][0]["token_ids"], "cached": usage["cached_tokens"]}


def test_idle_and_slowloris_sockets_are_closed_and_health_stays_up(server):
    rng = np.random.default_rng()
    prompt = rng.integers(1, 65530, 12).tolist()
    want = _greedy(server, prompt)["tokens"]
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(3 * CAP)]
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CAP)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    for _ in range(5):  # beyond the cap, the longest idle sockets make room: every probe gets in
        assert server.get("/health")[0] == 200
        assert _greedy(server, prompt)["tokens"] == want
        for s in slow:
            try:
                s.sendall(b"X-A: b\r\n")  # a header byte now and then does not keep it open
            except OSError:
                pass
        time.sleep(HEADER_TIMEOUT / 2)
    time.sleep(HEADER_TIMEOUT * 2)
    still_open = 0
    for s in idle + slow:
        s.settimeout(2)
        try:
            still_open += s.recv(1) != b""
        except ConnectionResetError:
            pass
        except socket.timeout:
            still_open += 1
        s.close()
    assert still_open == 0
    assert server.get("/health")[0] == 200


def _off_loop_jobs(server) -> tuple[int, int]:
    """(jobs submitted, jobs done) of the server's off-loop worker, from one /metrics scrape."""
    status, text = server.get("/metrics", AUTH)
    assert status == 200, text
    submitted = re.search(r"^rwkv7_off_loop_jobs_total ([0-9.e+]+)$", text, re.M)
    pending = re.search(r"^rwkv7_off_loop_jobs_pending ([0-9.e+]+)$", text, re.M)
    assert submitted and pending, text
    return int(float(submitted.group(1))), int(float(submitted.group(1)) - float(pending.group(1)))


def test_tokenize_runs_off_the_event_loop(server):
    """/health is answered while /tokenize work is in flight. Eight 3 MB bodies are sent at once.
    Once /metrics counts all eight handed to the off-loop worker, /health must answer 200, and a
    scrape after it must count fewer than eight of them done. Both counts only grow, so the health
    answer came while tokenizing was still waiting or running. This is shown by the server's own
    counts, with no sleep and no clock compared across threads."""
    text = " ".join(np.random.default_rng().choice(["alpha", "beta", "gamma", "delta"], 600_000))
    body = json.dumps({"prompt": text}).encode()
    replies: list[tuple[int, str]] = []
    submitted, done = _off_loop_jobs(server)
    assert submitted == done  # nothing from earlier tests still in flight

    def tokenize() -> None:
        replies.append(server.post("/tokenize", body, AUTH))

    threads = [threading.Thread(target=tokenize) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while _off_loop_jobs(server)[0] < submitted + 8:
        assert time.monotonic() < deadline, "the eight /tokenize bodies never all reached the off-loop worker"
    assert server.get("/health")[0] == 200
    done_after_health = _off_loop_jobs(server)[1]
    for t in threads:
        t.join()
    assert len(replies) == 8 and all(status == 200 and json.loads(reply)["count"] > 100_000
                                     for status, reply in replies)
    assert done_after_health < done + 8


def test_cache_salt_keeps_the_prefix_cache_from_telling_clients_apart(server):
    """A prompt another client sent is served from the cache (cached_tokens > 0) only for a
    request with the same cache_salt / prompt_cache_key; the greedy tokens never change."""
    rng = np.random.default_rng()
    secret = rng.integers(1, 65530, 150).tolist()
    first = _greedy(server, secret, cache_salt="alice")
    assert first["cached"] == 0
    assert _greedy(server, secret) == {"tokens": first["tokens"], "cached": 0}                    # no salt
    assert _greedy(server, secret, cache_salt="mallory") == {"tokens": first["tokens"], "cached": 0}
    assert _greedy(server, secret, prompt_cache_key="alice") == {"tokens": first["tokens"], "cached": 0}
    again = _greedy(server, secret, cache_salt="alice")
    assert again["tokens"] == first["tokens"] and again["cached"] >= 128
    shared = _greedy(server, secret)  # the shared namespace: the unsalted request above is cached
    assert shared["tokens"] == first["tokens"] and shared["cached"] >= 128
    status, reply = server.post("/v1/completions", json.dumps({"prompt": [1, 2], "cache_salt": "s" * 257}).encode(),
                                AUTH)
    assert status == 400 and "cache_salt" in reply


def test_metrics_need_the_api_key(server):
    assert server.get("/metrics")[0] == 401
    status, text = server.get("/metrics", AUTH)
    assert status == 200 and "rwkv7" in text
    assert server.get("/health")[0] == 200


def test_responses_metadata_is_bounded(server):
    def create(metadata: dict) -> tuple[int, str]:
        return server.post("/v1/responses", json.dumps({"input": "Hi", "max_output_tokens": 2, "temperature": 0,
                                                         "metadata": metadata}).encode(), AUTH)

    ok = {f"k{i}": "v" * 512 for i in range(16)}
    status, text = create(ok)
    assert status == 200 and json.loads(text)["metadata"] == ok
    for bad in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}):
        status, text = create(bad)
        assert status == 400 and "metadata" in text, text


def test_reply_size_is_bounded_before_work_starts(server):
    """echo + logprobs on a long prompt, times n: refused with a 400 naming --max-reply-entries
    when n x (prompt + max_tokens) x (1 + logprobs) is over it; a smaller n is served, and its
    greedy tokens are those of a plain request."""
    prompt = np.random.default_rng().integers(1, 65530, 200).tolist()
    want = _greedy(server, prompt)["tokens"]

    def ask(n: int) -> tuple[int, str]:
        return server.post("/v1/completions", json.dumps(
            {"prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 5, "n": n,
             "stop_token_ids": [], "return_token_ids": True}).encode(), AUTH)

    status, text = ask(8)  # 8 x 204 x 6 = 9,792 entries
    assert status == 400 and "9792 token entries" in text and f"--max-reply-entries {REPLY_ENTRIES}" in text
    assert json.loads(text)["error"]["param"] == "n"
    status, text = ask(2)  # 2,448 entries
    assert status == 200, text
    choices = json.loads(text)["choices"]
    assert len(choices) == 2 and all(c["token_ids"] == want for c in choices)
    assert len(choices[0]["logprobs"]["tokens"]) == len(prompt) + 4
    assert server.get("/health")[0] == 200


def test_metrics_open_serves_metrics_without_the_key(tiny_ckpt):
    pytest.importorskip("torch")
    import urllib.error
    import urllib.request

    from rwkv7_apps.engines import load_engine
    from rwkv7_apps.serve.cli import build_app
    from rwkv7_apps.serve.job import Limits
    from scheduler import Scheduler, SchedulerConfig
    from tests.rwkv7_apps.serve_harness import in_process_server

    sched = Scheduler(load_engine("torch", tiny_ckpt, kernels="torch"), SchedulerConfig(max_batch=2))
    app, service = build_app(sched, "m", {"max_tokens": 2}, Limits(64, 16), lambda: True, api_key=KEY,
                             metrics_open=True)
    with in_process_server(app, service) as url:
        root = url.removesuffix("/v1")
        with urllib.request.urlopen(root + "/metrics") as r:
            assert r.status == 200 and b"rwkv7_" in r.read()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/models")
        assert e.value.code == 401
