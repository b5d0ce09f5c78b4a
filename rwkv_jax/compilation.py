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
    ``call(key, *args)`` runs an executable; its first run (one-off set-up, up to hundreds of
    ms on CPU) is waited for and counted into ``compile_seconds``. Every listener added with
    ``add_listener`` is called ``listener(key, phase, start, seconds)`` in the compiling thread
    after each compile (phase "compile") and each first run (phase "first run"), so callers
    can leave both out of throughput.
    """

    def __init__(self, lower: Callable[[Hashable], "jax.stages.Lowered"]):
        self.lower = lower
        self.compile_seconds: dict = {}
        self._executables: dict = {}
        self._lock = threading.Lock()
        self._key_locks: dict = {}
        self._listeners: list[Callable[[Hashable, str, float, float], None]] = []
        self._never_run: set = set()

    def add_listener(self, listener: Callable[[Hashable, str, float, float], None]) -> None:
        self._listeners.append(listener)

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
                seconds = self.compile_seconds[key] = time.perf_counter() - start
                self._executables[key] = exe
                self._never_run.add(key)
                self._report(key, "compile", start, seconds)
        return exe

    def call(self, key, *args):
        """Run key's executable on args (compiling it first if needed)."""
        exe = self.get(key)
        if key not in self._never_run:
            return exe(*args)
        start = time.perf_counter()
        out = jax.block_until_ready(exe(*args))
        if key in self._never_run:
            self._never_run.discard(key)
            seconds = time.perf_counter() - start
            self.compile_seconds[key] += seconds
            self._report(key, "first run", start, seconds)
        return out

    def _report(self, key, phase: str, start: float, seconds: float) -> None:
        for listener in self._listeners:
            listener(key, phase, start, seconds)
