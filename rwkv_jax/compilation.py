"""Compiled executables, one cache per model or engine, and the opt-in persistent
compilation cache."""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Hashable

import jax
import jax.numpy as jnp

# XLA:CPU at LLVM optimisation level 1 instead of the default: 12-24% less compile time and the
# same decode/prefill speed (tiny and 0.1b, B = 1/8/32, T = 128; benchmarks/compile_speed.py,
# results/compile_speed.md): the matrix products are library calls either way.
# Copy insertion by region analysis: without it XLA:CPU copies the whole wkv state leaf after
# every layer's in-place update (12 copies of [B, L, H, N, N] a decode step, 36 copies in all at
# B = 1); with it the updates stay in place and the step makes no copy (docs/benchmarks.md,
# "Where the CPU decode step's time goes").
CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1, "xla_cpu_copy_insertion_use_region_analysis": True}


def slow_weights_note(platform: str, dtype) -> str | None:
    """A one-line note when weights of ``dtype`` decode slower than float32 ones on ``platform``
    with the ``xla`` kernels (None otherwise; the caller asks only for those). On XLA:CPU a
    product with bfloat16 / float16 weights converts every weight before its arithmetic (there is
    no 16-bit matrix-vector kernel; a one-row product even runs as two rows,
    ``pallas_kernels.small_m_linear.matmul_f32``), which costs more than the halved bytes save: a
    single sequence decodes slower than with float32 weights (docs/benchmarks.md). The ``native``
    kernels widen bfloat16 in registers (float16 stays on XLA's path)."""
    name = jnp.dtype(dtype).name
    if platform != "cpu" or name not in ("bfloat16", "float16"):
        return None
    fix = "kernels='native' (or 'auto')" if name == "bfloat16" else "dtype='bfloat16' with kernels='native'"
    return (f"{name} weights on the CPU with kernels='xla': XLA:CPU converts each weight inside every matrix "
            f"product, so decoding one or a few sequences runs slower than with float32 weights; for speed load "
            f"{fix}, dtype='float32', or quantization='int8'")


def compiler_options(platform: str) -> dict:
    """The XLA compile options for executables of ``platform`` ("cpu", "gpu", "cuda", ...)."""
    return dict(CPU_COMPILER_OPTIONS) if platform == "cpu" else {}


def platform_of(tree) -> str:
    """The platform the arrays (or placed ShapeDtypeStructs) of ``tree`` live on; JAX's default
    backend for unplaced structs."""
    sharding = getattr(jax.tree.leaves(tree)[0], "sharding", None)
    return next(iter(sharding.device_set)).platform if sharding is not None else jax.default_backend()


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
    ``jax.stages.Lowered`` to compile for it, compiled with ``options`` (XLA compile options,
    see ``compiler_options``).

    Thread-safe: one lock per key, so two threads compile different keys side by side and
    never the same key twice (the scheduler compiles ahead on a thread of its own,
    scheduler/ahead.py, while the decode thread runs what is compiled).
    ``compile_seconds[key]`` records how long each compile took. ``call(key, *args)`` runs
    an executable; its first run (one-off set-up, up to hundreds of ms on CPU) happens once,
    is waited for and counted into ``compile_seconds``. Every listener added with
    ``add_listener`` is called ``listener(key, phase, start, seconds)`` in the compiling thread
    after each compile (phase "compile") and each first run (phase "first run"), so callers
    can leave both out of throughput.
    """

    def __init__(self, lower: Callable[[tuple], "jax.stages.Lowered"], options: dict | None = None):
        self.lower = lower
        self.options = options or {}
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

    def _key_lock(self, key) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def get(self, key):
        """The executable for key, compiling (and timing) it on first use."""
        exe = self._executables.get(key)
        if exe is not None:
            return exe
        with self._key_lock(key):
            exe = self._executables.get(key)
            if exe is None:
                start = time.perf_counter()
                exe = self.lower(key).compile(self.options)
                seconds = self.compile_seconds[key] = time.perf_counter() - start
                self._never_run.add(key)  # before it is published: no caller skips the first run
                self._executables[key] = exe
                self._report(key, "compile", start, seconds)
        return exe

    def call(self, key, *args):
        """Run key's executable on args (compiling it first if needed). Its first run happens
        once, under the key's lock: another thread calling it meanwhile waits for it."""
        exe = self.get(key)
        if key not in self._never_run:
            return exe(*args)
        with self._key_lock(key):
            if key not in self._never_run:
                return exe(*args)
            start = time.perf_counter()
            out = jax.block_until_ready(exe(*args))
            seconds = time.perf_counter() - start
            self.compile_seconds[key] += seconds
            self._never_run.discard(key)
        self._report(key, "first run", start, seconds)
        return out

    def _report(self, key, phase: str, start: float, seconds: float) -> None:
        for listener in self._listeners:
            listener(key, phase, start, seconds)
