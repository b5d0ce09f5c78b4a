"""One replica of a ReplicaSet (its scheduler on a guarded engine, device, thread and
counters), the track of a request the set owns, and when a replica is taken out."""
from __future__ import annotations

import threading
from typing import Any, Protocol

MAX_FAILURES = 3
"""Consecutive engine exceptions (of one call kind) that take a replica out."""


class GuardCounts(Protocol):
    """A replica's engine-exception counters: ``EngineGuard`` (engine_guard.py) for a local
    engine, the last poll of them for a remote one."""

    @property
    def raised(self) -> int:
        """Exceptions the engine raised, in all."""

    @property
    def worst_streak(self) -> int:
        """The longest current run of consecutive exceptions of one call kind."""


class ReplicaLost(Exception):
    """Raised by a replica scheduler's ``run`` when its replica cannot go on (e.g. a remote
    process died): the replica is taken out with this message as the reason."""


class Replica:
    """One replica: its scheduler (on a guarded engine), device name, thread and counters."""

    def __init__(self, index: int, scheduler, guard: GuardCounts, device: str):
        self.index, self.scheduler, self.guard, self.device = index, scheduler, guard, device
        self.failed: str | None = None
        self.requests = 0           # results delivered from this replica
        self.routed = 0             # requests (groups count once) routed here
        self.generated_tokens = 0
        self.work = 0               # outstanding prompt + generation tokens routed here
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.death: str | None = None  # why its thread died, set by the thread before it ends

    def report(self) -> dict[str, Any]:
        """{device, requests, generated_tokens, failed, stats} (stats: the scheduler's Stats)."""
        return {"device": self.device, "requests": self.requests, "generated_tokens": self.generated_tokens,
                "failed": self.failed, "stats": self.scheduler.stats}


class Track:
    """A request the set owns until its result is delivered."""
    __slots__ = ("request", "replica", "internal_id", "attempts", "prompt_left", "tokens_left", "raised_at")

    def __init__(self, request):
        self.request = request
        self.replica: Replica | None = None
        self.internal_id = request.id
        self.attempts = 0
        self.prompt_left = len(request.prompt_tokens)
        self.tokens_left = int(max_tokens(request.params))
        self.raised_at = 0

    @property
    def work(self) -> int:
        return self.prompt_left + self.tokens_left


def max_tokens(params) -> int:
    """A request's max_tokens, from its SamplingParams or their dict form."""
    return params["max_tokens"] if isinstance(params, dict) else params.max_tokens
