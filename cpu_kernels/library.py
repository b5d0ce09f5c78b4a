"""Build, cache and register the native CPU kernels (``linear.cc``, ``wkv_step.cc``, ``shift_mix.cc``)
as XLA FFI targets.

The C++ sources ship with the package and are compiled on first use with the host's C++
compiler (``$CXX``, else ``g++`` / ``c++``) at ``-O3 -march=native`` against the XLA FFI
headers of the installed jaxlib (``jax.ffi.include_dir()``), so the vector width is the host's
(AVX-512, AVX2, NEON...). The shared library is cached under ``$RWKV7_CPU_KERNELS_DIR`` (default
``~/.cache/rwkv7-engine/cpu-kernels``), keyed by the sources and their header, the jax version,
the compiler and the host CPU's model and flags (a build unused for ``STALE_DAYS`` is removed
when another is made); it is written to a temporary name and renamed, so processes building at
once never see half a file. ``load()`` builds (a few seconds, once), loads and
registers every target for the ``cpu`` platform once per process and returns the ``Library``:
its path and the capabilities the build declares beyond the targets every build has
(``BF16_DOT``: bfloat16 products by the CPU's bfloat16 dot-product instruction, AVX512_BF16,
in both weight layouts, and of a bfloat16 x with quantized weights;
``MANY_ROWS``: register-blocked products of more than 4 rows with float32 / bfloat16 weights,
AVX-512; ``HALF_STATE``: the recurrence step on a float16 state, where the compiler has a float16
conversion; float32 and bfloat16 states every build takes);
anything that stops it (no compiler, a failed compile) is a ``NativeKernelsUnavailable``
naming the cause in one line.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import jax

SOURCES = tuple(Path(__file__).with_name(name) for name in ("linear.cc", "wkv_step.cc", "shift_mix.cc"))
# included by the sources: part of the cache key
HEADERS = tuple(Path(__file__).with_name(name) for name in ("vectors.h", "parallel.h"))
TARGETS = ("rwkv7_linear_f32", "rwkv7_linear_bf16", "rwkv7_linear_int8", "rwkv7_linear_int4", "rwkv7_linear_fp8",
           "rwkv7_linear_kn_f32", "rwkv7_linear_kn_bf16", "rwkv7_linear_group", "rwkv7_wkv_step", "rwkv7_time_mix_step",
           "rwkv7_shift_mix")
LANES = 16  # float32 lanes of linear.cc's vectors: the widths its kernels take are multiples of this
BF16_DOT = "bf16_dot"
MANY_ROWS = "many_rows"
HALF_STATE = "half_state"
# name -> (bit in rwkv7_capabilities(), the targets it adds)
CAPABILITIES = {BF16_DOT: (1, ("rwkv7_linear_bf16_dot", "rwkv7_linear_kn_bf16_dot", "rwkv7_linear_quantized_dot")),
                MANY_ROWS: (2, ()),
                HALF_STATE: (4, ())}
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
STALE_DAYS = 30  # a cached build unused this long is removed when another is built


class NativeKernelsUnavailable(RuntimeError):
    """The native CPU kernels cannot be built or loaded here (the message says why)."""


class Library(NamedTuple):
    """The loaded library: its path and the capabilities its build declares (see module doc)."""

    path: Path
    capabilities: frozenset[str]


def compiler() -> str:
    """The C++ compiler to use: ``$CXX`` when set (it must exist), else the first of g++ / c++ on PATH."""
    named = os.environ.get("CXX")
    if named:
        if shutil.which(named) is None:
            raise NativeKernelsUnavailable(f"native CPU kernels: the C++ compiler $CXX={named!r} is not found")
        return named
    for name in ("g++", "c++"):
        if shutil.which(name):
            return name
    raise NativeKernelsUnavailable("native CPU kernels need a C++ compiler: neither g++ nor c++ is on PATH "
                                   "(or set $CXX)")


def cache_dir() -> Path:
    return Path(os.environ.get("RWKV7_CPU_KERNELS_DIR", Path.home() / ".cache" / "rwkv7-engine" / "cpu-kernels"))


def host_cpu() -> str:
    """The host CPU's model name and feature flags (what ``-march=native`` compiles for)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        lines = [line for line in info.read_text().splitlines() if line.startswith(("model name", "flags", "Features"))]
        return "\n".join(lines[:3])
    return platform.processor() or platform.machine()


def library_path(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha1("\0".join([*(f.read_text() for f in (*SOURCES, *HEADERS)), jax.__version__, *version, host_cpu(), *FLAGS]).encode())
    return cache_dir() / f"linear-{key.hexdigest()[:16]}.so"


def prune(keep: Path) -> None:
    """Remove cached builds other than ``keep`` unused for STALE_DAYS (each use marks its build:
    ``build``); builds of other sources, jax versions or compilers pile up otherwise."""
    horizon = time.time() - STALE_DAYS * 86400
    for old in keep.parent.glob("linear-*.so"):
        try:
            if old != keep and old.stat().st_mtime < horizon:
                old.unlink()
        except OSError:  # another process pruned or rebuilt it meanwhile
            pass


def build() -> Path:
    """The compiled library for this host, built now if it is not in the cache."""
    cxx = compiler()
    target = library_path(cxx)
    if target.exists():
        os.utime(target)  # in use: not stale
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    prune(target)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [cxx, *FLAGS, "-isystem", jax.ffi.include_dir(), *map(str, SOURCES), "-o", tmp]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        raise NativeKernelsUnavailable(f"building the native CPU kernels failed ({cxx}): {first}")
    os.replace(tmp, target)
    return target


@functools.cache
def load() -> Library:
    """Build (if needed), load and register every target for the cpu platform; once a process."""
    path = build()
    try:
        lib = ctypes.cdll.LoadLibrary(str(path))
    except OSError as e:
        raise NativeKernelsUnavailable(f"loading the native CPU kernels {path} failed: {e}") from None
    declared = lib.rwkv7_capabilities()
    capabilities = frozenset(name for name, (bit, _) in CAPABILITIES.items() if declared & bit)
    targets = [*TARGETS, *(t for name in capabilities for t in CAPABILITIES[name][1])]
    for name in targets:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    return Library(path, capabilities)
