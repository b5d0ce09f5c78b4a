"""Prometheus metrics of the server (``GET /metrics``), on a registry of its own.

Counted as requests flow (``Service`` observer calls, from the scheduler thread): requests by
finish reason, prompt and generated tokens, TTFT (from submission) and inter-token
histograms; HTTP requests by endpoint (the served routes, every other path as "other", so
no client can grow the label set) and status. Read from the scheduler at scrape time:
requests waiting / in prefill / ready / running, each replica's decode bucket, prefix-cache
hits and misses, the prompt tokens they served, prompt tokens prefilled and finished states kept
(turn cache), and compiles and compile seconds by executable kind ("step", "prefill",
"score_piece", ...; the precompile at start and any on the request path: a stall shows here).
Read from ``offload.JOBS``: jobs handed to the off-loop worker, and how many of them wait or run.
"""
from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .offload import JOBS

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models", "/health",
                       "/metrics", "/tokenize", "/detokenize", "/tokenizer_info"})


class ServerMetrics:
    """``on_submit`` / ``on_token`` / ``on_finish`` observe requests, ``count_http`` answers;
    ``render()`` is the text."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rwkv7_requests", "Finished scheduler requests (one per choice) by outcome",
                                ["finish_reason"], registry=r)
        self.http = Counter("rwkv7_http_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                            registry=r)
        self.prompt_tokens = Counter("rwkv7_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generated_tokens = Counter("rwkv7_generated_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram("rwkv7_time_to_first_token_seconds", "Submission to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("rwkv7_inter_token_latency_seconds", "Gap between consecutive tokens of a request",
                             buckets=LATENCY_BUCKETS, registry=r)
        r.register(_SchedulerCollector(scheduler))
        r.register(_OffLoopCollector())
        self._lock = threading.Lock()
        self._submitted: dict[str, float] = {}
        self._last: dict[str, float] = {}

    def count_http(self, path: str, status: int) -> None:
        """One HTTP answer; a path outside ``ENDPOINTS`` counts as "other"."""
        self.http.labels(path if path in ENDPOINTS else "other", str(status)).inc()

    def on_submit(self, request_id: str) -> None:
        with self._lock:
            self._submitted[request_id] = time.perf_counter()

    def on_token(self, request_id: str, now: float) -> None:
        self.generated_tokens.inc()
        with self._lock:
            last = self._last.get(request_id)
            self._last[request_id] = now
            submitted = self._submitted.pop(request_id, None)
        if last is not None:
            self.itl.observe(now - last)
        elif submitted is not None:
            self.ttft.observe(now - submitted)

    def on_finish(self, out) -> None:
        self.requests.labels(out.finish_reason).inc()
        if out.finish_reason in ("stop", "length"):
            self.prompt_tokens.inc(out.prompt_tokens)
        with self._lock:
            self._last.pop(out.id, None)
            self._submitted.pop(out.id, None)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _OffLoopCollector:
    """The off-loop worker's job counts, read when scraped."""

    def collect(self):
        submitted, done = JOBS.snapshot()
        yield CounterMetricFamily("rwkv7_off_loop_jobs", "Jobs handed to the off-loop worker (tokenizing, "
                                  "request building, reply encoding)", value=submitted)
        yield GaugeMetricFamily("rwkv7_off_loop_jobs_pending", "Off-loop jobs waiting or running",
                                value=submitted - done)


class _SchedulerCollector:
    """Gauges and counters read from the scheduler when scraped."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        engine = self.scheduler.engine
        g = GaugeMetricFamily("rwkv7_engine_info", "What serves: the engine's resolved kernel set (e.g. "
                              "pallas-fused, or pallas after a failed self-check) and weights' dtype; value 1",
                              labels=["kernels", "dtype"])
        g.add_metric([engine.kernels, engine.dtype], 1)
        yield g
        sizes = self.scheduler.queue_sizes()
        g = GaugeMetricFamily("rwkv7_scheduler_requests", "Requests in each scheduler state", labels=["state"])
        for state, n in sizes.items():
            g.add_metric([state], n)
        yield g
        yield GaugeMetricFamily("rwkv7_live_batch", "Requests decoding (holding a batch slot)",
                                value=sizes["running"])
        g = GaugeMetricFamily("rwkv7_decode_bucket", "Current decode batch bucket of each replica",
                              labels=["replica"])
        for replica, bucket in enumerate(self.scheduler.decode_buckets()):
            g.add_metric([str(replica)], bucket)
        yield g
        stats = self.scheduler.stats
        c = CounterMetricFamily("rwkv7_prefix_cache_lookups", "Prefix-cache lookups by result", labels=["result"])
        c.add_metric(["hit"], stats.prefix_hits)
        c.add_metric(["miss"], stats.prefix_misses)
        yield c
        yield CounterMetricFamily("rwkv7_prefix_cache_hit_tokens", "Prompt tokens served by the prefix cache",
                                  value=stats.prefix_hit_tokens)
        yield CounterMetricFamily("rwkv7_prefill_tokens", "Prompt tokens run through the model (prefix-cache "
                                  "hits excluded)", value=stats.prefill_tokens)
        yield CounterMetricFamily("rwkv7_turn_states", "Finished requests' final states kept in the prefix cache",
                                  value=stats.turn_states)
        compiles = stats.compiles_by_kind()
        c = CounterMetricFamily("rwkv7_compiles", "Executables compiled (at start and on the request path) "
                                "by kind", labels=["kind"])
        s = CounterMetricFamily("rwkv7_compile_seconds", "Seconds spent compiling (and in first runs' "
                                "set-up) by executable kind", labels=["kind"])
        for kind, (n, seconds) in sorted(compiles.items()):
            c.add_metric([kind], n)
            s.add_metric([kind], seconds)
        yield c
        yield s
