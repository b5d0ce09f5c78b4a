"""Host-side LRU cache of prefill states keyed by exact token prefix, bounded in bytes."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

from rwkv7_core.engine import HostRow, host_row_bytes


class PrefixCache:
    """Maps a token tuple to the host row (state + last logits) after those tokens.

    ``longest_prefix(tokens)`` finds the longest cached key that is a prefix of ``tokens``
    (it may equal ``tokens``). Least recently used entries are evicted past ``max_bytes``;
    an entry larger than ``max_bytes`` is not stored. Thread-safe.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], tuple[HostRow, int]] = OrderedDict()
        self._lengths: dict[int, int] = {}  # key length -> number of keys of that length
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def longest_prefix(self, tokens: Sequence[int]) -> tuple[int, HostRow | None]:
        """(length, host row) of the longest cached prefix of tokens; (0, None) on a miss."""
        key = tuple(tokens)
        with self._lock:
            for n in sorted((n for n in self._lengths if n <= len(key)), reverse=True):
                hit = self._entries.get(key[:n])
                if hit is not None:
                    self._entries.move_to_end(key[:n])
                    return n, hit[0]
        return 0, None

    def put(self, tokens: Sequence[int], row: HostRow) -> None:
        key = tuple(tokens)
        size = host_row_bytes(row)
        if size > self.max_bytes or not key:
            return
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return
            self._entries[key] = (row, size)
            self._lengths[len(key)] = self._lengths.get(len(key), 0) + 1
            self.bytes += size
            while self.bytes > self.max_bytes:
                old, (_, old_size) = self._entries.popitem(last=False)
                self.bytes -= old_size
                self._lengths[len(old)] -= 1
                if not self._lengths[len(old)]:
                    del self._lengths[len(old)]
