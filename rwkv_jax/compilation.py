"""Compiled executables, one cache per model or engine, and the opt-in persistent
compilation cache."""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Hashable

import jax


def enable_compilation_cache(directory: str | os.PathLike) -> None:
    """Persist compiled executables under `directory` (jax_compilation_cache_dir) so a
    later process reuses them; every compilation is cached, however quick. Call it before
    the process's first compilation: JAX sets its cache up once."""
    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class ExecutableCache:
    """Compiled executables keyed by any hashable key; ``lower(key)`` returns the
    ``jax.stages.Lowered`` to compile for it.

    Thread-safe: one lock per key, so two threads compile different keys side by side and
    never the same key twice. ``compile_seconds[key]`` records how long each compile took.
    """

    def __init__(self, lower: Callable[[Hashable], "jax.stages.Lowered"]):
        self.lower = lower
        self.compile_seconds: dict = {}
        self._executables: dict = {}
        self._lock = threading.Lock()
        self._key_locks: dict = {}

    def __contains__(self, key) -> bool:
        return key in self._executables

    def keys(self) -> list:
        return list(self._executables)

    def get(self, key):
        """The executable for key, compiling (and timing) it on first use."""
        exe = self._executables.get(key)
        if exe is not None:
            return exe
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            exe = self._executables.get(key)
            if exe is None:
                start = time.perf_counter()
                exe = self.lower(key).compile()
                self.compile_seconds[key] = time.perf_counter() - start
                self._executables[key] = exe
        return exe
