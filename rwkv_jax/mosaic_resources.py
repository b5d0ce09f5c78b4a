"""Registers, spills and shared memory of the Pallas Mosaic GPU kernels a compile builds.

Mosaic GPU compiles its kernels itself (they reach XLA as custom calls, so XLA's dump holds no
PTX for them and ``gpu_dump.step_report`` cannot see them). ``MOSAIC_GPU_DUMP_PTXAS=1`` (read at
each compile) makes it report ``ptxas -v`` per kernel: printed to the process's stdout, or with
``MOSAIC_GPU_DUMP_TO=DIR`` written to ``DIR/<name>_<n>.ptxas`` beside ``<name>_<n>.resources.txt``
(the kernel's shared-memory scratch), its PTX and every MLIR pass's module (megabytes a kernel:
a whole 1.5b step writes gigabytes). ``recorded(files=...)`` turns it on for the compiles inside
it (the persistent compilation cache off: a cached executable compiles nothing) and yields the
list it fills on leaving with one ``MosaicKernel`` per kernel compiled: with files=True from
the dump folder (shared memory included), else from file descriptor 1 read meanwhile (no
shared memory: the printed resources do not name their kernel, and they come in another order
than ptxas's reports). Plain text and regular expressions: no GPU needed.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Iterator

import jax

from .gpu_dump import parse_ptxas

DUMP_TO, DUMP_PTXAS = "MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTXAS"
KERNEL_SUFFIX = "_mosaic_gpu_kernel"  # Mosaic's entry name: the kernel_name + this


@dataclass(frozen=True)
class MosaicKernel:
    """One compiled Mosaic GPU kernel: registers per thread, spill bytes (stores + loads) per
    thread, and shared memory per block (scratch + ptxas's static bytes; None when unknown)."""

    name: str
    registers: int
    spill_bytes: int
    smem_bytes: int | None

    def as_dict(self) -> dict:
        return asdict(self)


def _kernel(entry: str, res, smem: int | None) -> MosaicKernel:
    name = entry[:-len(KERNEL_SUFFIX)] if entry.endswith(KERNEL_SUFFIX) else entry
    return MosaicKernel(name, res.registers, res.spill_bytes, smem)


def parse_log(text: str) -> list[MosaicKernel]:
    """The kernels of ptxas reports printed one after another (their names repeat)."""
    return [_kernel(entry, res, None) for block in re.split(r"(?=ptxas info\s+: Compiling entry function)", text)
            for entry, res in parse_ptxas(block).items()]


def read_dump(folder: str) -> list[MosaicKernel]:
    """The kernels of a ``MOSAIC_GPU_DUMP_TO`` folder, in file name order."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "*.ptxas"))):
        with open(path) as f:
            entries = parse_ptxas(f.read())
        scratch = 0
        resources = path[:-len(".ptxas")] + ".resources.txt"
        if os.path.isfile(resources):
            with open(resources) as f:
                found = re.search(r"smem_scratch_bytes=(\d+)", f.read())
            scratch = int(found[1]) if found else 0
        out += [_kernel(entry, res, scratch + res.static_shared_bytes) for entry, res in entries.items()]
    return out


@contextlib.contextmanager
def _environment(values: dict):
    """os.environ updated with values (and the persistent compilation cache off) inside."""
    saved = {k: os.environ.get(k) for k in values}
    cache = jax.config.jax_enable_compilation_cache
    os.environ.update(values)
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", cache)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def recorded(files: bool = False) -> Iterator[list[MosaicKernel]]:
    """Yields a list filled, on leaving, with the Mosaic kernels compiled inside (see module doc)."""
    kernels: list[MosaicKernel] = []
    if files:
        with tempfile.TemporaryDirectory(prefix="rwkv7_mosaic_dump_") as folder:
            with _environment({DUMP_TO: folder, DUMP_PTXAS: "1"}):
                yield kernels
            kernels.extend(read_dump(folder))
        return
    sys.stdout.flush()
    stdout = os.dup(1)
    with tempfile.TemporaryFile() as log, _environment({DUMP_PTXAS: "1"}):
        os.dup2(log.fileno(), 1)
        try:
            yield kernels
        finally:
            sys.stdout.flush()
            os.dup2(stdout, 1)
            os.close(stdout)
            log.seek(0)
            kernels.extend(parse_log(log.read().decode(errors="replace")))


def summary(kernels: list[MosaicKernel]) -> list[dict]:
    """Per kernel name: compiles, registers min-max, the most spill bytes and shared memory
    min-max (None when not recorded)."""
    by_name: dict[str, list[MosaicKernel]] = {}
    for k in kernels:
        by_name.setdefault(k.name, []).append(k)
    out = []
    for name, ks in sorted(by_name.items()):
        smem = [k.smem_bytes for k in ks if k.smem_bytes is not None]
        out.append({"name": name, "compiles": len(ks), "registers": [min(k.registers for k in ks),
                                                                       max(k.registers for k in ks)],
                    "max_spill_bytes": max(k.spill_bytes for k in ks),
                    "smem_bytes": [min(smem), max(smem)] if smem else None})
    return out
