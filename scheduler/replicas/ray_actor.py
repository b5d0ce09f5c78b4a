"""The Ray actor of ``rwkv7-generate --ray``: one replica (engine + scheduler) in its own
process, driven through ``ActorScheduler`` (scheduler/replicas/ray_cluster.py) and polled for
what happened. It does not import Ray: Ray wraps the class (``ray.remote``) on the driver.

The scheduler runs in a thread of the actor whenever it has work; the actor's methods
(one at a time, in call order) add requests, cancel them, score prompts, precompile, and
hand back, per poll, the events since the last one. Requests, outputs and token logprobs
cross as the scheduler's own (pickled) objects.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from rwkv7_core.engine import Engine
from rwkv7_core.tokenizer import tokenizer_for

from ..config import SchedulerConfig
from ..core import Scheduler
from ..stats import Stats
from .build import engine_device
from .engine_guard import EngineGuard, Fault
from .replica import MAX_FAILURES


class ReplicaActor:
    """One replica. ``__init__`` loads the model with ``load_engine()`` (a picklable callable
    the driver gives, run in this process: an exception there is the actor's creation error,
    which the driver reports); ``config`` holds the ``SchedulerConfig`` fields."""

    def __init__(self, load_engine: Callable[[], Engine], config: dict, fault: tuple | None):
        engine = load_engine()
        self.guard = EngineGuard(engine, Fault(*fault) if fault else None)
        self.scheduler = Scheduler(self.guard, SchedulerConfig(**config), tokenizer=tokenizer_for(engine.vocab_size))
        self.device = f"{os.uname().nodename}:{os.getpid()}/{engine_device(engine)}"
        self.max_failures = MAX_FAILURES
        self.lock = threading.Lock()
        self.events: list = []
        self.failed: str | None = None
        self.stopping = False
        self.wake = threading.Event()
        threading.Thread(target=self._serve, name="replica", daemon=True).start()

    def ready(self) -> dict[str, Any]:
        """{device, pid, logprobs_unsupported, engine: the engine's facts (vocab_size,
        capabilities, config, dtype, kernels, device, prefill_pieces)}: the model is loaded."""
        engine = self.guard
        facts = {k: getattr(engine, k) for k in ("vocab_size", "capabilities", "config", "dtype", "kernels",
                                                 "device", "prefill_pieces")}
        return {"device": self.device, "pid": os.getpid(), "engine": facts,
                "logprobs_unsupported": self.scheduler.logprobs_unsupported}

    def pid(self) -> int:
        return os.getpid()

    def submit(self, adds: list) -> None:
        """Queue requests: each a ``Request`` (``Scheduler.add``) or a list of them (``add_group``)."""
        for item in adds:
            if isinstance(item, list):
                self.scheduler.add_group(item)
            else:
                self.scheduler.add(item)
        self.wake.set()

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    def score(self, tokens: list[int]):
        return self.scheduler.score(tokens)

    def precompile(self) -> None:
        self.scheduler.precompile()

    def poll(self, timeout: float, stop: bool) -> dict[str, Any]:
        """What happened since the last poll, waiting up to ``timeout`` s for something.
        ``stop``: start no more requests (those started run to completion) while it is True.
        {events: [(kind "token" | "logprobs" | "finish", id, token | TokenLogprobs |
        RequestOutput)], unstarted: [id], queue_sizes, bucket, raised, worst_streak,
        failed (why the replica cannot go on, or None)}."""
        if self.stopping and not stop:
            self.wake.set()  # requests left waiting by the stop may start now
        self.stopping = stop
        end = time.monotonic() + timeout
        while time.monotonic() < end and not (self.events or self.failed):
            time.sleep(0.005)
        with self.lock:
            events, self.events = self.events, []
        failed = self.failed
        if failed is None and self.guard.worst_streak >= self.max_failures:
            failed = f"its engine raised {self.guard.worst_streak} times in a row"
        return {"events": events, "unstarted": self.scheduler.unstarted(), "queue_sizes": self.scheduler.queue_sizes(),
                "bucket": self.guard.bucket, "raised": self.guard.raised, "worst_streak": self.guard.worst_streak,
                "failed": failed}

    def stats(self):
        """(a copy of the scheduler's Stats, clock: this process's time.time() - time.perf_counter())."""
        for _ in range(10):
            try:
                return Stats.merged([self.scheduler.stats]), time.time() - time.perf_counter()
            except RuntimeError:  # a record was appended while copying: again
                continue
        raise RuntimeError("the scheduler's stats kept changing while being copied")

    def _serve(self) -> None:
        try:
            while True:
                self.wake.wait()
                self.wake.clear()
                self.scheduler.run(on_token=lambda rid, token: self._event("token", rid, token),
                                   on_finish=lambda out: self._event("finish", out.id, out),
                                   on_logprobs=lambda rid, scored: self._event("logprobs", rid, scored),
                                   should_stop=lambda: self.stopping)
        except BaseException as e:  # noqa: BLE001 - reported to the driver by poll
            self.failed = f"its thread died: {type(e).__name__}: {e}"

    def _event(self, kind: str, request_id: str, payload) -> None:
        with self.lock:
            self.events.append((kind, request_id, payload))
