"""CPU work of a request run off the event loop, so ``/health`` and every other connection
keep being served while a large body is tokenized, a job is built or a large reply encoded.

The work runs on one worker thread, in submission order. Request building relies on that
order: it draws seeds and ids from shared generators in arrival order, as it did on the loop.
One thread is also the fastest choice here, because this work holds the GIL. The tokenizer's
Rust encoder and ``json.dumps`` hold it for a whole call, so more threads would run it no
faster. Each extra thread would also be one more holder the event loop waits behind before it
can answer anyone.

``JOBS`` counts what was handed over; ``/metrics`` shows it.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


class JobCounts:
    """Jobs submitted to the worker and jobs done (finished, failed or cancelled before they ran);
    thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._submitted = 0
        self._done = 0

    def submitted(self) -> None:
        with self._lock:
            self._submitted += 1

    def done(self, _: Future) -> None:
        with self._lock:
            self._done += 1

    def snapshot(self) -> tuple[int, int]:
        """(submitted, done), read together."""
        with self._lock:
            return self._submitted, self._done


JOBS = JobCounts()
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rwkv7-off-loop")


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the worker thread, awaited. Its exception is raised here. A request that
    is cancelled while its job waits also cancels the job."""
    JOBS.submitted()
    future = _WORKER.submit(fn, *args)
    future.add_done_callback(JOBS.done)
    return await asyncio.wrap_future(future)
