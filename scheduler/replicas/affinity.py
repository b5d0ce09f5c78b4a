"""Conversation affinity of a replica set: which replica last consumed a token sequence.

A conversation's next turn re-sends its history: its prompt begins with an earlier turn's
prompt, or with that turn's prompt + output (``previous_response_id``). When a request
finishes, ``record`` remembers both sequences (hashed, with the initial state's key) as
served by its replica; ``lookup`` finds the replica of the longest remembered sequence the
new prompt begins with, so the turn can go where the scheduler's turn-boundary cache holds
its state. Bounded: the least recently used of more than ``max_entries`` sequences are forgotten.
"""
from __future__ import annotations

import bisect
import hashlib
import threading
from collections import Counter, OrderedDict
from typing import Sequence

import numpy as np

MAX_ENTRIES = 1 << 16


def _hasher(state_key: str | None):
    return hashlib.blake2b((state_key or "").encode(), digest_size=16)


class ConversationAffinity:
    """{(length, digest of the initial state key + the first ``length`` tokens): replica
    index}. A lookup hashes the prompt once, in C, reading a digest at each recorded length."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self._where: OrderedDict[tuple[int, bytes], int] = OrderedDict()
        self._lengths: list[int] = []  # sorted distinct lengths of the keys
        self._count: Counter[int] = Counter()
        self._lock = threading.Lock()

    def record(self, state_key: str | None, prompt: Sequence[int], output: Sequence[int], replica: int) -> None:
        """``replica`` served ``prompt`` and generated ``output`` after it."""
        data = np.asarray([*prompt, *output], np.int64).tobytes()
        h = _hasher(state_key)
        h.update(data[:8 * len(prompt)])
        keys = [(len(prompt), h.digest())]
        if output:
            h.update(data[8 * len(prompt):])
            keys.append((len(prompt) + len(output), h.digest()))
        with self._lock:
            for key in keys:
                if key not in self._where:
                    self._add_length(key[0])
                self._where[key] = replica
                self._where.move_to_end(key)
            while len(self._where) > self.max_entries:
                self._drop(next(iter(self._where)))

    def lookup(self, state_key: str | None, prompt: Sequence[int]) -> int | None:
        """The replica of the longest recorded sequence ``prompt`` begins with (None: none)."""
        data = np.asarray(prompt, np.int64).tobytes()
        h, done, best = _hasher(state_key), 0, None
        with self._lock:
            for n in self._lengths[:bisect.bisect_right(self._lengths, len(prompt))]:
                h.update(data[8 * done:8 * n])
                done = n
                key = (n, h.digest())
                if key in self._where:
                    best = key
            if best is None:
                return None
            self._where.move_to_end(best)
            return self._where[best]

    def forget_replica(self, replica: int) -> None:
        """Drop every sequence of a replica taken out."""
        with self._lock:
            for key in [k for k, r in self._where.items() if r == replica]:
                self._drop(key)

    def _add_length(self, n: int) -> None:
        if not self._count[n]:
            bisect.insort(self._lengths, n)
        self._count[n] += 1

    def _drop(self, key: tuple[int, bytes]) -> None:
        del self._where[key]
        self._count[key[0]] -= 1
        if not self._count[key[0]]:
            del self._count[key[0]]
            self._lengths.pop(bisect.bisect_left(self._lengths, key[0]))
