"""One thread, with a known large stack, that runs every grammar compile of the process.

llguidance compiles by native recursion on the calling thread's stack; a thread started by
a web framework or a thread pool has whatever stack its creator chose. Every compile runs
here instead, on ``STACK_BYTES`` of stack (address space reserved, touched only as used),
so the depth a spec may reach (scheduler/grammar_limits.py) does not depend on the caller,
and a caller on an event loop can await the compile (``submit`` returns a Future) instead of
running it on the loop.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")

STACK_BYTES = 256 * 2**20
"""The compile thread's stack."""


class CompileThread:
    """A daemon thread that runs submitted callables one at a time, in order."""

    def __init__(self, stack_bytes: int = STACK_BYTES):
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        with _STACK_SIZE_LOCK:  # threading.stack_size is process-wide: set it only for this start
            previous = threading.stack_size(stack_bytes)
            try:
                self._thread = threading.Thread(target=self._serve, name="grammar-compile", daemon=True)
                self._thread.start()
            finally:
                threading.stack_size(previous)

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        """``fn()`` run on the compile thread; its result or exception in the Future."""
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the compile thread, waited for (run inline when called from it)."""
        if threading.current_thread() is self._thread:
            return fn()
        return self.submit(fn).result()

    def _serve(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # the caller gets it; this thread keeps serving
                future.set_exception(e)


_STACK_SIZE_LOCK = threading.Lock()
