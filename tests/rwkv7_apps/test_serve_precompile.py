"""rwkv7-serve compiles every executable a request can reach before /health says ready (its
default): /metrics counts the compiles by executable kind at start, and a burst of varied
requests after ready (prompt lengths 1..600, batches up to 4 and back, forks, logprobs,
echo scoring, streams, chat) compiles nothing more: the counters stay put and JAX's own
compile log (JAX_LOG_COMPILES) shows no compile after the ready line. Without precompile
the counters start empty and count the compiles that requests cause."""
from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.rwkv7_apps.serve_harness import in_process_server, running_server

MAX_BATCH = 4
BUCKETS = 3           # 1, 2, 4
PIECES = 9            # the JAX engine's prefill piece lengths 1, 2, 4, ..., 256


def compiles(text: str, name: str = "rwkv7_compiles_total") -> dict[str, float]:
    """{kind: value} of a compile counter in /metrics text."""
    return {m[1]: float(m[2]) for m in re.finditer(rf'^{name}\{{kind="([^"]+)"\}} (\S+)$', text, re.M)}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--random-model", "tiny-world", "--max-batch", MAX_BATCH, "--max-tokens", "5"]
    with running_server(args, tmp_path_factory.mktemp("precompiled"), precompile=True,
                        env={"JAX_LOG_COMPILES": "1"}) as s:
        yield s


def _request(server, rng, i: int) -> tuple[str, dict]:
    """One of the request shapes the server can run, with a fresh random prompt."""
    prompt = rng.integers(1, 65536, int(rng.integers(1, 600))).tolist()
    kind = i % 6
    if kind == 0:
        return "/v1/completions", {"prompt": prompt, "max_tokens": int(rng.integers(1, 6)), "seed": i}
    if kind == 1:
        return "/v1/completions", {"prompt": prompt, "n": 3, "max_tokens": 3, "temperature": 1.0, "seed": i}
    if kind == 2:
        return "/v1/completions", {"prompt": prompt, "max_tokens": 4, "logprobs": 2, "temperature": 0}
    if kind == 3:
        return "/v1/completions", {"prompt": prompt[:300] + [1], "max_tokens": 1, "echo": True, "logprobs": 1,
                                   "temperature": 0}
    if kind == 4:
        return "/v1/completions", {"prompt": prompt, "max_tokens": 4, "stream": True,
                                   "stream_options": {"include_usage": True}}
    text = " ".join(f"w{t}" for t in prompt[: int(rng.integers(1, 60))])
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 3,
                                    "logprobs": True, "top_logprobs": 2}


def test_ready_only_after_everything_compiled_and_a_burst_compiles_nothing(server):
    start = server.get("/metrics")[1]
    counts = compiles(start)
    assert counts["step"] == counts["step_logprobs"] == counts["insert"] == counts["extract"] == BUCKETS
    assert counts["gather"] == BUCKETS * (BUCKETS - 1)  # every resize between two buckets
    assert counts["prefill"] == counts["score_piece"] == PIECES
    assert counts["varlen_prefill"] >= 1 and counts["row_logprobs"] == counts["sample"] == 1
    seconds = compiles(start, "rwkv7_compile_seconds_total")
    assert set(seconds) == set(counts) and all(s > 0 for s in seconds.values())
    assert re.search(r"precompiled in [0-9.]+ s \(\d+ executables", server.log_text())

    rng = np.random.default_rng()
    jobs = [_request(server, rng, i) for i in range(36)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: server.post(job[0], json.dumps(job[1]).encode()), jobs))
    assert [status for status, _ in answers] == [200] * len(jobs), [a for a in answers if a[0] != 200][:1]
    assert all('"finish_reason"' in body for _, body in answers)

    end = server.get("/metrics")[1]
    assert compiles(end) == counts
    assert compiles(end, "rwkv7_compile_seconds_total") == seconds
    assert server.metric("rwkv7_requests_total", 'finish_reason="length"') + \
        server.metric("rwkv7_requests_total", 'finish_reason="stop"') >= len(jobs)
    log = server.log_text()
    after_ready = log[log.index("ready: http://"):]
    assert "Finished tracing" in log[:log.index("ready: http://")]  # JAX_LOG_COMPILES took effect
    assert not re.findall(r"^.*(?:Compiling |XLA compilation).*$", after_ready, re.M)


def test_without_precompile_the_counters_count_request_path_compiles(tiny_ckpt):
    from rwkv7_apps.engines import load_engine
    from rwkv7_apps.serve.cli import build_app
    from rwkv7_apps.serve.job import Limits
    from scheduler import Scheduler, SchedulerConfig

    engine = load_engine("jax", tiny_ckpt, "float32", "xla")
    sched = Scheduler(engine, SchedulerConfig(max_batch=2))
    app, service = build_app(sched, "m", {"max_tokens": 2}, Limits(64, 16, 64), lambda: True)
    with in_process_server(app, service) as url:
        root = url.removesuffix("/v1")
        with urllib.request.urlopen(root + "/metrics", timeout=30) as r:  # the compile-ahead thread may
            before = compiles(r.read().decode())  # have compiled the first bucket already (scheduler/ahead.py)
        body = json.dumps({"prompt": np.random.default_rng().integers(1, 100, 5).tolist(), "max_tokens": 2})
        request = urllib.request.Request(url + "/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            assert r.status == 200
        with urllib.request.urlopen(root + "/metrics", timeout=30) as r:
            text = r.read().decode()
    counts, seconds = compiles(text), compiles(text, "rwkv7_compile_seconds_total")
    assert all(counts.get(what, 0) >= n for what, n in before.items())  # counters only grow
    assert counts["step"] >= 1 and counts["prefill"] >= 1 and counts["sample"] == 1
    assert "step_logprobs" not in counts  # compiled only when a request scores
    assert seconds["step"] > 0
