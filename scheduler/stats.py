"""Run statistics in bounded memory: totals as counters and sums, latency percentiles from
log histograms (relative error <= ``RELATIVE_ERROR``, scheduler/sketch.py), the decode-step
timeline downsampled (``Timeline``), every compile as an event, and only the most recent
``recent`` records of each per-step / per-request / per-prefill / per-switch kind (for
inspection and tests; the totals and percentiles cover the whole run).

Throughput figures exclude compile time: an engine call that compiled (an engine with
``Capability.REPORTS_COMPILES`` says so, in the compiling thread) has its compile seconds
subtracted before its seconds are recorded; TTFT is wall time and keeps them.

Each compile is booked to the thread that ran it (``CompileEvent.thread``, a role the
scheduler gives its threads with ``set_role``): ``"decode"`` (the decode thread waited for
it: compile time on the critical path), ``"ahead"`` (scheduler/ahead.py compiled it while
the batch decoded: hidden), ``"prefill"`` (the prefill worker waited: delays first tokens,
not the decode steps), ``"precompile"`` (before the first step), ``"other"`` (any other thread).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import NamedTuple

from .sketch import RELATIVE_ERROR, LogHistogram, Timeline

__all__ = ["BucketSwitch", "COMPILE_THREADS", "CompileEvent", "PrefillRecord", "RELATIVE_ERROR", "RequestRecord",
           "Stats", "StepRecord"]

PEAK_WINDOW = 8
"""Consecutive decode steps over which the peak decode rate is measured."""

COMPILE_THREADS = ("decode", "ahead", "prefill", "precompile", "other")
"""The roles a compile is booked to (module docstring); "decode" is the critical path."""


class StepRecord(NamedTuple):
    time: float      # perf_counter at the start of the step
    bucket: int
    live: int        # rows holding a request
    path: str        # engine kernel path of the step
    seconds: float   # engine.step wall time (includes fetching the sampled tokens), compiles excluded
    wanted: int = 0  # the bucket its rows wanted; != bucket: that one was still compiling (0: the same)


class RequestRecord(NamedTuple):
    id: str
    prompt_tokens: int
    cached_tokens: int          # prompt tokens served by the prefix cache
    prefill_seconds: float | None
    ttft: float | None          # first token time - arrival time
    generated_tokens: int
    finish_reason: str
    arrival_time: float
    finish_time: float


class CompileEvent(NamedTuple):
    time: float      # perf_counter when the compile started
    what: str        # the executable, e.g. "step:8", "prefill:64", "bucket 8"; "step:8 first run":
    seconds: float   # its first run's one-off set-up (Capability.REPORTS_COMPILES)
    thread: str = "other"  # who ran it, one of COMPILE_THREADS (``Stats.record_compile`` sets it)

    @property
    def kind(self) -> str:
        """The executable's kind: "step" of "step:8", "bucket" of "bucket 8"."""
        return self.what.split(":", 1)[0].split(" ", 1)[0]

    @property
    def first_run(self) -> bool:
        """A first run's set-up, not a compile."""
        return self.what.endswith(" first run")


class BucketSwitch(NamedTuple):
    time: float
    from_bucket: int
    to_bucket: int
    live: int
    seconds: float   # engine.resize wall time, compiles excluded
    compile_wait: float = 0.0  # seconds the decode thread waited for compiles to make this switch


class PrefillRecord(NamedTuple):
    time: float
    id: str
    tokens: int      # tokens actually run (prompt minus cached prefix)
    seconds: float   # this piece's share of its call, compiles excluded


class Stats:
    """Aggregates of every run so far (see the module docstring); thread-safe where the
    prefill worker and the decode loop both record (prefills, compiles)."""

    def __init__(self, recent: int = 10_000, timeline_points: int = 2048):
        self.steps: deque[StepRecord] = deque(maxlen=recent)
        self.requests: deque[RequestRecord] = deque(maxlen=recent)
        self.prefills: deque[PrefillRecord] = deque(maxlen=recent)
        self.switches: deque[BucketSwitch] = deque(maxlen=recent)
        self.compiles: list[CompileEvent] = []
        self.timeline = Timeline(timeline_points)
        self.ttft = LogHistogram()
        self.inter_token = LogHistogram()
        self.step_seconds = LogHistogram()
        self.prefix_hits = self.prefix_misses = self.prefix_removed = 0
        self.prefix_hit_tokens = 0   # prompt tokens served by the prefix cache
        self.turn_states = 0         # finished requests' final states kept in the prefix cache
        self.decode_steps = self.decode_tokens = 0
        self.decode_seconds = 0.0
        self.prefill_tokens = 0
        self.prefill_seconds = 0.0
        self.prefill_calls: dict[str, int] = {}  # engine prefill calls by kind: serial, varlen, mixed
        self.compile_seconds = 0.0
        self.compile_seconds_by_thread: dict[str, float] = {}  # COMPILE_THREADS role -> seconds
        self.blocked_seconds = 0.0   # the decode thread blocked on a compile another thread had in progress
        self.kept_steps = 0          # steps run in another bucket than wanted: that one was compiling
        self.ahead_failures = 0      # background compiles that raised (the bucket then compiled on use)
        self.finished: dict[str, int] = {}
        self.prompt_tokens = self.generated_tokens = 0
        self.mask_steps, self.mask_rows, self.mask_seconds = 0, 0, 0.0  # grammar masks: steps, rows, host s
        self._peak = 0.0
        self._last_steps: deque[tuple[int, float]] = deque(maxlen=PEAK_WINDOW)
        self._lock = threading.Lock()
        self._thread = threading.local()

    # ---- recording ------------------------------------------------------------------
    def record_step(self, start: float, bucket: int, live: int, path: str, seconds: float,
                    wanted: int = 0) -> None:
        """One decode step; ``wanted``: the bucket its rows wanted when that one was still
        compiling (the step kept another: ``kept_steps``), else 0."""
        self.steps.append(StepRecord(start, bucket, live, path, seconds, wanted or bucket))
        if wanted and wanted != bucket:
            self.kept_steps += 1
        self.timeline.add(start, seconds, bucket, live)
        self.step_seconds.add(seconds)
        self.decode_steps += 1
        self.decode_tokens += live
        self.decode_seconds += seconds
        last = self._last_steps
        last.append((live, seconds))
        if len(last) == PEAK_WINDOW:
            busy = sum(s for _, s in last)
            if busy > 0:
                self._peak = max(self._peak, sum(n for n, _ in last) / busy)

    def record_masks(self, rows: int, seconds: float) -> None:
        """One step's grammar masks: ``rows`` constrained rows computed in ``seconds`` of host time."""
        self.mask_steps += 1
        self.mask_rows += rows
        self.mask_seconds += seconds

    def record_request(self, record: RequestRecord) -> None:
        self.requests.append(record)
        self.finished[record.finish_reason] = self.finished.get(record.finish_reason, 0) + 1
        self.prompt_tokens += record.prompt_tokens
        self.generated_tokens += record.generated_tokens
        if record.ttft is not None:
            self.ttft.add(record.ttft)

    def record_prefill(self, record: PrefillRecord) -> None:
        with self._lock:
            self.prefills.append(record)
            self.prefill_tokens += record.tokens
            self.prefill_seconds += record.seconds

    def record_prefill_call(self, kind: str) -> None:
        """One engine call that ran prompt pieces: ``kind`` "serial", "varlen" or "mixed"."""
        with self._lock:
            self.prefill_calls[kind] = self.prefill_calls.get(kind, 0) + 1

    def record_prefix_lookups(self, hits: int, misses: int, removed: int = 0, hit_tokens: int = 0) -> None:
        """Prefix-cache lookups that found a cached prefix (``hits``, serving ``hit_tokens``
        prompt tokens in all) or none (``misses``), and entries ``removed`` (unreadable on
        disk, or non-finite in use)."""
        with self._lock:
            self.prefix_hits += hits
            self.prefix_misses += misses
            self.prefix_removed += removed
            self.prefix_hit_tokens += hit_tokens

    def record_turn_state(self) -> None:
        """A finished request's final state went into the prefix cache (``turn_cache``)."""
        with self._lock:
            self.turn_states += 1

    def record_switch(self, switch: BucketSwitch) -> None:
        self.switches.append(switch)

    def record_compile(self, event: CompileEvent) -> None:
        """A compile, booked to the calling thread's role; also counted against that thread's
        current engine call."""
        event = event._replace(thread=self.role())
        with self._lock:
            self.compiles.append(event)
            self.compile_seconds += event.seconds
            by = self.compile_seconds_by_thread
            by[event.thread] = by.get(event.thread, 0.0) + event.seconds
        self._thread.compiled = self.compiled_in_this_thread() + event.seconds

    def record_ahead_failure(self) -> None:
        """A background compile raised (scheduler/ahead.py logged it)."""
        with self._lock:
            self.ahead_failures += 1

    def set_role(self, role: str) -> None:
        """Book this thread's compiles from now on to ``role`` (one of COMPILE_THREADS)."""
        if role not in COMPILE_THREADS:
            raise ValueError(f"unknown compile thread role {role!r}; choose one of {COMPILE_THREADS}")
        self._thread.role = role

    def role(self) -> str:
        """This thread's role (``set_role``; "other" when never set)."""
        return getattr(self._thread, "role", "other")

    def record_blocked(self, seconds: float) -> None:
        """The decode thread waited ``seconds`` for a compile another thread had in progress
        (its own compiles are events)."""
        self.blocked_seconds += seconds

    @property
    def compile_seconds_waited(self) -> float:
        """Compile seconds the decode thread waited for (the critical path): its own compiles
        and those of other threads it blocked on."""
        return self.compile_seconds_by_thread.get("decode", 0.0) + self.blocked_seconds

    @property
    def compile_seconds_hidden(self) -> float:
        """Compile seconds spent ahead, beside the decode steps."""
        return self.compile_seconds_by_thread.get("ahead", 0.0)

    def compiles_by_kind(self) -> dict[str, tuple[int, float]]:
        """{executable kind: (compiles, seconds)}; first runs add their seconds, not a compile."""
        with self._lock:
            events = list(self.compiles)
        out: dict[str, tuple[int, float]] = {}
        for e in events:
            n, seconds = out.get(e.kind, (0, 0.0))
            out[e.kind] = (n + (not e.first_run), seconds + e.seconds)
        return out

    def compiled_in_this_thread(self) -> float:
        """Compile seconds recorded by this thread so far."""
        return getattr(self._thread, "compiled", 0.0)

    def start_call(self) -> tuple[float, float]:
        """A clock for one engine call: (this thread's compile seconds so far, perf_counter)."""
        return self.compiled_in_this_thread(), time.perf_counter()

    def call_seconds(self, clock: tuple[float, float]) -> float:
        """Wall seconds since ``start_call`` gave ``clock``, less the compiles this thread
        recorded meanwhile."""
        compiled = self.compiled_in_this_thread() - clock[0]
        return max(0.0, time.perf_counter() - clock[1] - compiled)

    # ---- moving and merging (replica sets) ------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_lock"], state["_thread"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock, self._thread = threading.Lock(), threading.local()

    def shift_times(self, delta: float) -> None:
        """Move every recorded perf_counter time by ``delta`` (onto another process's clock)."""
        self.steps = deque((r._replace(time=r.time + delta) for r in self.steps), maxlen=self.steps.maxlen)
        self.prefills = deque((r._replace(time=r.time + delta) for r in self.prefills), maxlen=self.prefills.maxlen)
        self.switches = deque((r._replace(time=r.time + delta) for r in self.switches), maxlen=self.switches.maxlen)
        self.requests = deque((r._replace(arrival_time=r.arrival_time + delta, finish_time=r.finish_time + delta)
                               for r in self.requests), maxlen=self.requests.maxlen)
        self.compiles = [e._replace(time=e.time + delta) for e in self.compiles]
        for w in self.timeline.windows:
            w[0] += delta
            w[1] += delta

    @classmethod
    def merged(cls, parts: list["Stats"]) -> "Stats":
        """One Stats of several schedulers' (replicas side by side): counters and sums added,
        histograms merged, records and timeline windows interleaved by time (bounded as
        before); the peak decode rate is the best of the parts'."""
        out = cls(max((p.steps.maxlen or 0 for p in parts), default=10_000))
        by_time = lambda records, key: sorted((r for p in parts for r in records(p)), key=key)  # noqa: E731
        for name in ("steps", "prefills", "switches"):
            getattr(out, name).extend(by_time(lambda p: getattr(p, name), lambda r: r.time))  # noqa: B023 - called in this iteration
        out.requests.extend(by_time(lambda p: p.requests, lambda r: r.finish_time))
        out.compiles = by_time(lambda p: p.compiles, lambda e: e.time)
        for name in ("prefix_hits", "prefix_misses", "prefix_removed", "prefix_hit_tokens", "turn_states",
                     "decode_steps", "decode_tokens",
                     "decode_seconds", "prefill_tokens", "prefill_seconds", "compile_seconds", "prompt_tokens",
                     "generated_tokens", "mask_steps", "mask_rows", "mask_seconds", "kept_steps", "ahead_failures", "blocked_seconds"):
            setattr(out, name, sum(getattr(p, name) for p in parts))
        for p in parts:
            for role, seconds in p.compile_seconds_by_thread.items():
                out.compile_seconds_by_thread[role] = out.compile_seconds_by_thread.get(role, 0.0) + seconds
            for reason, n in p.finished.items():
                out.finished[reason] = out.finished.get(reason, 0) + n
            for kind, n in p.prefill_calls.items():
                out.prefill_calls[kind] = out.prefill_calls.get(kind, 0) + n
            for name in ("ttft", "inter_token", "step_seconds"):
                getattr(out, name).merge(getattr(p, name))
        out._peak = max((p._peak for p in parts), default=0.0)
        for w in sorted((w for p in parts for w in p.timeline.windows), key=lambda w: w[0]):
            out.timeline.add_window(list(w))
        return out

    # ---- derived --------------------------------------------------------------------
    @property
    def requests_finished(self) -> int:
        return sum(self.finished.values())

    @property
    def prefix_hit_rate(self) -> float | None:
        n = self.prefix_hits + self.prefix_misses
        return self.prefix_hits / n if n else None

    @property
    def prefill_tok_s(self) -> float | None:
        """Prompt tokens run / prefill seconds, compiles excluded."""
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens drawn by decode steps / decode-step seconds, compiles excluded."""
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def decode_tok_s_peak(self) -> float | None:
        """The highest rate over any PEAK_WINDOW consecutive steps (all steps when fewer)."""
        if self.decode_steps < PEAK_WINDOW:
            return self.decode_tok_s
        return self._peak or None

    def to_dict(self) -> dict:
        """JSON-able: the totals, percentiles, timeline windows, compiles and recent records."""
        def rows(records):
            return [r._asdict() for r in records]
        return {
            "totals": {"requests": self.requests_finished, "finished": dict(self.finished),
                       "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                       "decode_steps": self.decode_steps, "decode_tokens": self.decode_tokens,
                       "decode_seconds": self.decode_seconds, "prefill_tokens": self.prefill_tokens,
                       "prefill_seconds": self.prefill_seconds, "prefill_calls": dict(self.prefill_calls),
                       "compile_seconds": self.compile_seconds,
                       "compile_seconds_by_thread": dict(self.compile_seconds_by_thread),
                       "kept_steps": self.kept_steps, "ahead_failures": self.ahead_failures,
                       "blocked_seconds": self.blocked_seconds,
                       "mask_steps": self.mask_steps,
                       "mask_rows": self.mask_rows, "mask_seconds": self.mask_seconds},
            "rates": {"prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s,
                      "decode_tok_s_peak": self.decode_tok_s_peak},
            "percentiles_relative_error": RELATIVE_ERROR,
            "ttft_s": self.ttft.percentiles(), "inter_token_s": self.inter_token.percentiles(),
            "decode_step_s": self.step_seconds.percentiles(),
            "timeline": rows(self.timeline.points()),
            "compiles": rows(self.compiles),
            "recent": {"steps": rows(self.steps), "requests": rows(self.requests),
                       "prefills": rows(self.prefills), "switches": rows(self.switches)},
            "prefix_cache": {"hits": self.prefix_hits, "misses": self.prefix_misses,
                             "removed": self.prefix_removed, "hit_rate": self.prefix_hit_rate,
                             "hit_tokens": self.prefix_hit_tokens, "turn_states": self.turn_states},
        }
