"""The scheduler's books: every tracked request and the queue its state puts it in.

A request's state and its queue change together, in ``Books.move`` only:
WAITING -> ``waiting`` (a group's forks wait with their leader, outside the queue);
PREFILL -> counted in ``prefilling``; READY -> ``ready``; RUNNING -> counted in ``running``
(its slot is in the slot table); a final state -> ``finals``, with its finish reason, until
the run thread reports it. Any thread may read or move under ``cond``.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from rwkv7_core.sampling import SamplingParams, TokenLogprobs
from rwkv7_core.stop_strings import StopMatcher

from .errors import ErrorCode, FinishReason
from .grammar import Matcher
from .request import Request, RequestOutput, RequestState, final_state


class Entry:
    """Scheduler-side record of one request (``params``/``prompt``: validated; ``error`` and
    ``error_code``: why it is invalid or failed (``fail``); ``reason``: its finish reason once final)."""

    def __init__(self, request: Request, arrival: float):
        self.id = request.id
        self.request = request
        self.params: SamplingParams | None = None
        self.prompt: list[int] = []
        self.initial = request.initial_state
        self.state = RequestState.WAITING
        self.times = {RequestState.WAITING: arrival}
        self.arrival = arrival
        self.reason: FinishReason | None = None
        self.tokens: list[int] = []
        self.row = None
        self.first_token: int | None = None
        self.first_token_time: float | None = None
        self.last_emit = 0.0  # perf_counter of its newest token (inter-token gaps)
        self.cached_tokens = 0
        self.prefill_seconds: float | None = None
        self.error: str | None = None
        self.error_code: ErrorCode | None = None
        self.final_state = None  # host row, with Request.return_state
        self.cancel_requested = False
        self.slot = -1
        self.forks: list[Entry] = []  # requests sharing this one's prefill (add_group)
        self.stop_matcher: StopMatcher | None = None  # its stop strings, fed its output's bytes
        self.stop_token: int | None = None       # the stop token that ended it
        self.stop_logprobs: TokenLogprobs | None = None  # of the stop token, with params.logprobs
        self.matcher: Matcher | None = None  # its grammar Matcher (scheduler/grammar.py), with request.constraint

    def fail(self, code: ErrorCode, message: str) -> None:
        """Record why the request failed (it still has to be finished "error")."""
        self.error, self.error_code = message, code

    def output(self) -> RequestOutput:
        """The result of a final entry."""
        return RequestOutput(id=self.id, tokens=self.tokens, finish_reason=self.reason, error=self.error,
                             prompt_tokens=len(self.prompt) or len(self.request.prompt_tokens),
                             generated_tokens=len(self.tokens), arrival_time=self.arrival,
                             first_token_time=self.first_token_time, finish_time=self.times[self.state],
                             final_state=self.final_state, stop_token=self.stop_token,
                             stop_logprobs=self.stop_logprobs, cached_tokens=self.cached_tokens,
                             error_code=self.error_code)


class Books:
    """The tracked requests by id and their queues (see the module docstring)."""

    def __init__(self):
        self.cond = threading.Condition()  # re-entrant: ``move`` may run inside a held block
        self.entries: dict[str, Entry] = {}
        self.waiting: deque[Entry] = deque()
        self.ready: deque[Entry] = deque()
        self.finals: deque[Entry] = deque()
        self.cancels: set[str] = set()  # ids the run thread still has to cancel
        self.prefilling = 0
        self.running = 0

    def track(self, entry: Entry) -> None:
        with self.cond:
            self.entries[entry.id] = entry

    def forget(self, entry: Entry) -> None:
        """Drop a reported entry."""
        with self.cond:
            del self.entries[entry.id]

    def state(self, request_id: str) -> RequestState | None:
        """A tracked request's state (None once reported, or never added)."""
        entry = self.entries.get(request_id)
        return None if entry is None else entry.state

    def move(self, entry: Entry, state: RequestState) -> None:
        """Set ``entry``'s state and move it into that state's queue (out of its old one)."""
        with self.cond:
            self._leave(entry)
            entry.state = state
            entry.times[state] = time.perf_counter()
            if state is RequestState.WAITING:
                self.waiting.append(entry)
            elif state is RequestState.PREFILL:
                self.prefilling += 1
            elif state is RequestState.READY:
                self.ready.append(entry)
            elif state is RequestState.RUNNING:
                self.running += 1
            else:
                self.finals.append(entry)
            self.cond.notify_all()

    def finish(self, entry: Entry, reason: FinishReason) -> None:
        """Make ``entry`` final with ``reason`` (see ``request.final_state``)."""
        entry.reason = FinishReason(reason)
        self.move(entry, final_state(reason))

    def _leave(self, entry: Entry) -> None:
        state = entry.state
        if state is RequestState.WAITING:
            if self.waiting and self.waiting[0] is entry:
                self.waiting.popleft()
            elif entry in self.waiting:  # else a fork, waiting with its leader
                self.waiting.remove(entry)
        elif state is RequestState.PREFILL:
            self.prefilling -= 1
        elif state is RequestState.READY:
            if self.ready and self.ready[0] is entry:
                self.ready.popleft()
            else:
                self.ready.remove(entry)
        elif state is RequestState.RUNNING:
            self.running -= 1

    def cancel(self, request_id: str) -> None:
        """A waiting request (not a group's leader) is final at once; any other unfinished one
        is left to the run thread."""
        with self.cond:
            entry = self.entries.get(request_id)
            if entry is None or entry.state.is_final:
                return
            if entry.state is RequestState.WAITING and entry in self.waiting and not entry.forks:
                self.finish(entry, FinishReason.CANCELLED)
            else:
                self.cancels.add(request_id)
            self.cond.notify_all()

    def take_cancels(self) -> list[Entry]:
        """The unfinished entries whose cancel is pending (run thread)."""
        with self.cond:
            ids, self.cancels = self.cancels, set()
            entries = [self.entries.get(i) for i in ids]
        return [e for e in entries if e is not None and not e.state.is_final]

    def take_finals(self) -> list[Entry]:
        with self.cond:
            finals, self.finals = list(self.finals), deque()
        return finals

    def queue_sizes(self) -> dict[str, int]:
        """{"waiting", "prefill", "ready", "running"}: requests in each state now."""
        with self.cond:
            waiting = len(self.waiting) + sum(len(e.forks) for e in self.waiting)
            return {"waiting": waiting, "prefill": self.prefilling, "ready": len(self.ready),
                    "running": self.running}

    def unstarted(self) -> list[str]:
        """Ids of the requests still WAITING."""
        with self.cond:
            return [f.id for e in self.waiting for f in [e, *e.forks]]
