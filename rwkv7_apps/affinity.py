"""Conversation affinity of a replica set: which replica last consumed a token sequence.

A conversation's next turn re-sends its history: its prompt begins with an earlier turn's
prompt, or with that turn's prompt + output (``previous_response_id``). When a request
finishes, ``record`` remembers both sequences (hashed, with the initial state's key) as
served by its replica; ``lookup`` finds the replica of the longest remembered sequence the
new prompt begins with, so the turn can go where the scheduler's turn-boundary cache holds
its state. Bounded: the least recently used of more than ``max_entries`` sequences are forgotten.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

MAX_ENTRIES = 1 << 16
_MOD = (1 << 61) - 1
_BASE = 1_000_003


def _seed(state_key: str | None) -> int:
    return hash(state_key) % _MOD if state_key is not None else 0


class ConversationAffinity:
    """{(length, rolling hash of the first ``length`` tokens + initial state key): replica index}."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._where: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, state_key: str | None, prompt: Sequence[int], output: Sequence[int], replica: int) -> None:
        """``replica`` served ``prompt`` and generated ``output`` after it."""
        h = _seed(state_key)
        keys = []
        for n, token in enumerate((*prompt, *output), 1):
            h = (h * _BASE + int(token) + 1) % _MOD
            if n == len(prompt) or n == len(prompt) + len(output):
                keys.append((n, h))
        with self._lock:
            for key in keys:
                self._where[key] = replica
                self._where.move_to_end(key)
            while len(self._where) > self.max_entries:
                self._where.popitem(last=False)

    def lookup(self, state_key: str | None, prompt: Sequence[int]) -> int | None:
        """The replica of the longest recorded sequence ``prompt`` begins with (None: none)."""
        h = _seed(state_key)
        best = None
        with self._lock:
            for n, token in enumerate(prompt, 1):
                h = (h * _BASE + int(token) + 1) % _MOD
                if (n, h) in self._where:
                    best = (n, h)
            if best is None:
                return None
            self._where.move_to_end(best)
            return self._where[best]

    def forget_replica(self, replica: int) -> None:
        """Drop every sequence of a replica taken out."""
        with self._lock:
            for key in [k for k, r in self._where.items() if r == replica]:
                del self._where[key]
