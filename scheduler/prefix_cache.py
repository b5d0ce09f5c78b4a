"""Host-side LRU cache of prefill states keyed by (initial state, exact token prefix),
bounded in bytes, optionally backed by a persistent disk tier (scheduler/prefix_disk.py)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

from rwkv7_core.engine import HostRow, host_row_bytes

from .prefix_disk import DiskPrefixStore
from .token_radix import TokenRadix


class PrefixCache:
    """Maps (namespace, token tuple) to the host row (state + last logits) after those tokens.

    The namespace names the state the tokens ran from ("" = zeros; else an
    ``InitialState.key``). ``longest_prefix(tokens, namespace)`` finds the longest cached key
    of that namespace that is a prefix of ``tokens`` (it may equal ``tokens``; a radix tree per
    namespace finds it in one walk over ``tokens``, scheduler/token_radix.py). Least recently
    used entries are evicted past ``max_bytes``; an entry larger than ``max_bytes`` is not
    kept in memory. With ``disk``, every entry is also written there (so it survives the
    process), lookups the memory misses go on to the disk, and disk hits come back into
    memory. ``drop`` removes an entry whose state gave non-finite values (memory and disk);
    ``take_removed()`` returns (and resets) how many entries were dropped or found unreadable
    on disk since the last call. Thread-safe.
    """

    def __init__(self, max_bytes: int, disk: DiskPrefixStore | None = None):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.disk = disk
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], tuple[HostRow, int]] = OrderedDict()
        self._keys: dict[str, TokenRadix] = {}  # namespace -> its keys in memory
        self._lock = threading.Lock()
        self._removed = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest_prefix(self, tokens: Sequence[int], namespace: str = "") -> tuple[int, HostRow | None]:
        """(length, host row) of the longest cached prefix of tokens; (0, None) on a miss."""
        key = tuple(tokens)
        n, row = self._memory_prefix(key, namespace)
        if self.disk is not None and n < len(key):
            m, disk_row, removed = self.disk.longest_prefix(key, namespace, longer_than=n)
            with self._lock:
                self._removed += removed
            if m > n:
                self._remember(namespace, key[:m], disk_row)
                return m, disk_row
        return n, row

    def put(self, tokens: Sequence[int], row: HostRow, namespace: str = "") -> None:
        key = tuple(tokens)
        if not key:
            return
        if self._remember(namespace, key, row) and self.disk is not None:
            self.disk.put(key, row, namespace)

    def drop(self, tokens: Sequence[int], namespace: str = "") -> None:
        key = tuple(tokens)
        with self._lock:
            hit = self._entries.pop((namespace, key), None)
            if hit is not None:
                self._forget(namespace, key, hit[1])
            removed = hit is not None
        if self.disk is not None and self.disk.remove(key, namespace):
            removed = True
        with self._lock:
            self._removed += removed

    def take_removed(self) -> int:
        with self._lock:
            n, self._removed = self._removed, 0
        return n

    def _memory_prefix(self, key: tuple[int, ...], namespace: str) -> tuple[int, HostRow | None]:
        with self._lock:
            keys = self._keys.get(namespace)
            n = 0 if keys is None else keys.longest_prefix(key)
            if not n:
                return 0, None
            self._entries.move_to_end((namespace, key[:n]))
            return n, self._entries[(namespace, key[:n])][0]

    def _remember(self, namespace: str, key: tuple[int, ...], row: HostRow) -> bool:
        """Keep an entry in memory (LRU); False when it was there already."""
        size = host_row_bytes(row)
        with self._lock:
            if (namespace, key) in self._entries:
                self._entries.move_to_end((namespace, key))
                return False
            if size > self.max_bytes:
                return True
            self._entries[(namespace, key)] = (row, size)
            self._keys.setdefault(namespace, TokenRadix()).add(key)
            self.bytes += size
            while self.bytes > self.max_bytes:
                (ns, old), (_, old_size) = self._entries.popitem(last=False)
                self._forget(ns, old, old_size)
        return True

    def _forget(self, namespace: str, key: tuple[int, ...], size: int) -> None:
        """Account an entry taken out of ``_entries`` (caller holds the lock)."""
        self.bytes -= size
        keys = self._keys[namespace]
        keys.remove(key)
        if not len(keys):
            del self._keys[namespace]
