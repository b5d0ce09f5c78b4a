"""The scheduler as a service for async HTTP handlers.

One thread runs the scheduler's ``run(serve_until=...)`` for the server's lifetime (a
``scheduler.interface.SchedulerInterface``: one Scheduler or a ReplicaSet); handlers only
``submit`` requests (``add`` / ``add_group``, thread-safe) and read events from an
``asyncio.Queue`` per request, filled from the scheduler thread's callbacks through
``loop.call_soon_threadsafe`` (no model work on the event loop); the events of one step
share one wake-up of the loop. ``cancel`` frees a slot at
the next step; ``score`` runs prompt scoring in a worker thread.

Availability (``outage``): ``close`` stops admission for a shutdown ("draining"); an
exception that ends the scheduler's run makes the service "failed", and ``fail`` does so
from outside (e.g. compiling failed). Either way ``abort`` ends the requests still
outstanding with an error whose message starts ``UNAVAILABLE``; a closed service refuses
``submit`` (ServiceClosed).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from rwkv7_core.sampling import SamplingParams, TokenLogprobs
from scheduler import ErrorCode, FinishReason, Request, RequestOutput
from scheduler.interface import SchedulerInterface

log = logging.getLogger("rwkv7_serve")
UNAVAILABLE = "server unavailable: "
"""How the error of a request the service itself ended (``abort``) begins."""


class Outage(NamedTuple):
    """Why the service takes no new requests: ``status`` "draining" or "failed"."""
    status: str
    reason: str


class ServiceClosed(RuntimeError):
    """``submit`` on a service that is draining or failed (the message is the reason)."""


@dataclass
class Token:
    """One emitted token (``logprobs``: its TokenLogprobs of N=1 when the request asked)."""
    id: int
    time: float
    logprobs: TokenLogprobs | None = None


class Stream:
    """Where one scheduler request's events go: ``(request id, Token)`` ..., then
    ``(request id, RequestOutput)``, put on ``queue`` (shared by the choices of one HTTP
    request) in the event loop's thread."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.id = request_id
        self.loop = loop
        self.queue = queue
        self.pending_logprobs: TokenLogprobs | None = None  # scheduler thread only


class Service:
    """Owns the scheduler thread; ``observer`` (metrics) gets on_token/on_finish calls too."""

    def __init__(self, scheduler: SchedulerInterface, observer=None):
        self.scheduler = scheduler
        self.observer = observer
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._serve, name="scheduler", daemon=True)
        self._pending: list[tuple[Stream, object]] = []  # events not yet on their queues
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        self.outage: Outage | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def submit(self, requests: Sequence[Request], shared_prompt: bool, queue: asyncio.Queue) -> None:
        """Queue requests (``shared_prompt``: one prefill for all, ``add_group``); their
        events go to ``queue``. Call from the event loop. ServiceClosed once closed."""
        loop = asyncio.get_running_loop()
        streams = [Stream(r.id, loop, queue) for r in requests]
        with self._lock:
            if self.outage is not None:
                raise ServiceClosed(self.outage.reason)
            self._streams.update((s.id, s) for s in streams)
        if self.observer is not None:
            for r in requests:
                self.observer.on_submit(r.id)
        if shared_prompt and len(requests) > 1:
            self.scheduler.add_group(requests)
        else:
            for r in requests:
                self.scheduler.add(r)
        with self._lock:  # aborted while being added: the scheduler drops them too
            aborted: list[str] = ([r.id for r in requests if r.id not in self._streams]
                                  if self.outage is not None else [])
        for request_id in aborted:
            self.scheduler.cancel(request_id)

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    async def score(self, tokens: Sequence[int]) -> TokenLogprobs:
        return await asyncio.to_thread(self.scheduler.score, tokens)

    def rehearse(self, prompt: Sequence[int]) -> None:
        """Run one 2-token request of ``prompt`` through the scheduler thread and wait for it
        (from any thread but an event loop's; counted like any request): the one-off set-up of
        a first call (threads, lazy paths) lands here instead of on a client's first request."""
        async def one() -> None:
            queue: asyncio.Queue = asyncio.Queue()
            self.submit([Request(self.new_id("warm-up"), list(prompt), SamplingParams(max_tokens=2))], False, queue)
            while not isinstance((await queue.get())[1], RequestOutput):
                pass
        asyncio.run(one())

    def in_flight(self) -> int:
        """Requests submitted and not yet final."""
        with self._lock:
            return len(self._streams)

    def close(self, reason: str) -> None:
        """Stop admission ("draining"); requests in flight go on."""
        with self._lock:
            if self.outage is None:
                self.outage = Outage("draining", reason)

    def fail(self, reason: str) -> None:
        """The service cannot go on: "failed", and every outstanding request aborted."""
        with self._lock:
            self.outage = Outage("failed", reason)
        self.abort(reason)

    def abort(self, reason: str) -> None:
        """End every outstanding request now with the error ``UNAVAILABLE + reason`` (code
        ``ErrorCode.UNAVAILABLE``; the scheduler cancels them)."""
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        now = time.perf_counter()
        for stream in streams:
            self._deliver(stream, RequestOutput(stream.id, [], FinishReason.ERROR, UNAVAILABLE + reason,
                                                prompt_tokens=0, generated_tokens=0, arrival_time=now,
                                                first_token_time=None, finish_time=now,
                                                error_code=ErrorCode.UNAVAILABLE))
            self.scheduler.cancel(stream.id)

    # -- scheduler thread ---------------------------------------------------------------
    def _serve(self) -> None:
        """Run the scheduler until ``stop``; an exception out of it fails the service."""
        try:
            self.scheduler.run(on_token=self._on_token, on_finish=self._on_finish,
                               on_logprobs=self._on_logprobs, serve_until=self._stop.is_set)
        except BaseException as e:  # noqa: BLE001 - reported through outage, never a silent hang
            log.debug("the scheduler failed", exc_info=True)
            self.fail(f"the scheduler failed: {type(e).__name__}: {e}")

    def _stream(self, request_id: str) -> Stream | None:
        with self._lock:
            return self._streams.get(request_id)

    def _on_logprobs(self, request_id: str, scored: TokenLogprobs) -> None:
        stream = self._stream(request_id)
        if stream is not None:
            stream.pending_logprobs = scored

    def _on_token(self, request_id: str, token: int) -> None:
        now = time.perf_counter()
        if self.observer is not None:
            self.observer.on_token(request_id, now)
        stream = self._stream(request_id)
        if stream is not None:
            event, stream.pending_logprobs = Token(token, now, stream.pending_logprobs), None
            self._deliver(stream, event)

    def _on_finish(self, out: RequestOutput) -> None:
        if self.observer is not None:
            self.observer.on_finish(out)
        with self._lock:
            stream = self._streams.pop(out.id, None)
        if stream is not None:
            self._deliver(stream, out)

    def _deliver(self, stream: Stream, event) -> None:
        """Queue an event for the loop; one wake-up carries everything pending."""
        with self._pending_lock:
            self._pending.append((stream, event))
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        try:
            stream.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass

    def _flush(self) -> None:
        """In the event loop: move pending events onto their streams' queues."""
        with self._pending_lock:
            pending, self._pending, self._flush_scheduled = self._pending, [], False
        for stream, event in pending:
            stream.queue.put_nowait((stream.id, event))
