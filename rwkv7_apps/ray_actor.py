"""The Ray actor of ``rwkv7-generate --ray``: one replica (engine + scheduler) in its own
process, fed by the driver (rwkv7_apps/ray_replicas.py) and polled for its results.

The scheduler runs in a thread of the actor whenever it has work; the actor's methods
(one at a time, in call order) add requests, cancel them, stop admissions, and hand back
what happened since the last poll. Requests and results cross as plain dicts.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any


class ReplicaActor:
    """One replica. ``__init__`` loads the model (an exception there is the actor's creation
    error, which the driver reports); ``random_model`` names a seeded random model, written
    on this node if missing, instead of ``model_path``."""

    def __init__(self, backend: str, model_path: str | None, random_model: str | None, dtype: str, kernels: str,
                 config: dict, fault: tuple | None):
        from rwkv7_core.tokenizer import tokenizer_for
        from scheduler import Scheduler, SchedulerConfig

        from .engines import engine_device, load_engine, random_model_path
        from .replicas import MAX_FAILURES, EngineGuard, Fault

        path = random_model_path(random_model) if random_model else model_path
        engine = load_engine(backend, path, dtype, kernels)
        self.guard = EngineGuard(engine, Fault(*fault) if fault else None)
        self.scheduler = Scheduler(self.guard, SchedulerConfig(**config), tokenizer=tokenizer_for(engine.vocab_size))
        self.device = f"{os.uname().nodename}:{os.getpid()}/{engine_device(engine)}"
        self._max_failures = MAX_FAILURES
        self._lock = threading.Lock()
        self._tokens: list = []
        self._finished: list = []
        self._failed: str | None = None
        self._stopping = False
        self._wake = threading.Event()
        self._loop = threading.Thread(target=self._serve, name="replica", daemon=True)
        self._loop.start()

    def ready(self) -> dict[str, Any]:
        """{vocab_size, device, pid}: the model is loaded."""
        return {"vocab_size": self.scheduler.engine.vocab_size, "device": self.device, "pid": os.getpid()}

    def pid(self) -> int:
        return os.getpid()

    def submit(self, requests: list[dict]) -> None:
        """Queue requests: dicts {id, prompt_tokens, params (SamplingParams dict)}."""
        from rwkv7_core.sampling import SamplingParams
        from scheduler import Request

        for r in requests:
            self.scheduler.add(Request(r["id"], r["prompt_tokens"], SamplingParams.from_dict(r["params"])))
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    def stop(self) -> None:
        """Start no more requests (those started run to completion)."""
        self._stopping = True

    def poll(self, timeout: float) -> dict[str, Any]:
        """What happened since the last poll, waiting up to ``timeout`` s for something:
        {tokens: [(id, token)], finished: [RequestOutput fields], unstarted: [id],
        raised, worst_streak, failed (why the replica cannot go on, or None)}."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and not (self._tokens or self._finished or self._failed):
            time.sleep(0.005)
        with self._lock:
            tokens, self._tokens = self._tokens, []
            finished, self._finished = self._finished, []
        failed = self._failed
        if failed is None and self.guard.worst_streak >= self._max_failures:
            failed = f"its engine raised {self.guard.worst_streak} times in a row"
        return {"tokens": tokens, "finished": finished, "unstarted": self.scheduler.unstarted(),
                "raised": self.guard.raised, "worst_streak": self.guard.worst_streak, "failed": failed}

    def stats(self):
        """(a copy of the scheduler's Stats, clock: this process's time.time() - time.perf_counter())."""
        from scheduler.stats import Stats

        for _ in range(10):
            try:
                return Stats.merged([self.scheduler.stats]), time.time() - time.perf_counter()
            except RuntimeError:  # a record was appended while copying: again
                continue
        raise RuntimeError("the scheduler's stats kept changing while being copied")

    def _serve(self) -> None:
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                self.scheduler.run(on_token=self._on_token, on_finish=self._on_finish,
                                   should_stop=lambda: self._stopping)
        except BaseException as e:  # noqa: BLE001 - reported to the driver by poll
            self._failed = f"its thread died: {type(e).__name__}: {e}"

    def _on_token(self, request_id: str, token: int) -> None:
        with self._lock:
            self._tokens.append((request_id, token))

    def _on_finish(self, out) -> None:
        fields = {k: getattr(out, k) for k in ("id", "tokens", "finish_reason", "error", "prompt_tokens",
                                              "generated_tokens", "arrival_time", "first_token_time",
                                              "finish_time")}
        with self._lock:
            self._finished.append(fields)
