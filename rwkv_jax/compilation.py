"""One compiled executable per (B, T, full_output) bucket, AOT compilation, and the
opt-in persistent compilation cache."""
from __future__ import annotations

import os
import time
from typing import Callable

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
    """Compiled executables keyed by bucket; `build(key)` returns a jax.stages.Lowered."""

    def __init__(self, build: Callable):
        self._build = build
        self.executables: dict = {}
        self.compile_seconds: dict = {}

    def get(self, key):
        exe = self.executables.get(key)
        if exe is None:
            start = time.perf_counter()
            exe = self._build(key).compile()
            self.compile_seconds[key] = time.perf_counter() - start
            self.executables[key] = exe
        return exe
