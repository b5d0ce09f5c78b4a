"""CPU work of a request run off the event loop, so ``/health`` and every other connection
keep being served while a large body is tokenized or a large reply is encoded.

``off_loop``: in Starlette's thread pool. ``serially_off_loop``: the same, one call at a time
(for request building, which draws seeds and ids from shared generators in arrival order, as
it did on the loop).
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")
_SERIAL = threading.Lock()


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    return await run_in_threadpool(fn, *args)


async def serially_off_loop(fn: Callable[..., T], *args: object) -> T:
    def run() -> T:
        with _SERIAL:
            return fn(*args)
    return await run_in_threadpool(run)
