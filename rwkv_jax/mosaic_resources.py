"""Registers, spills and shared memory of the Pallas Mosaic GPU kernels a compile builds.

Mosaic GPU compiles its kernels itself (they reach XLA as custom calls, so XLA's dump holds no
PTX for them and ``gpu_dump.step_report`` cannot see them). With ``MOSAIC_GPU_DUMP_TO=DIR`` and
``MOSAIC_GPU_DUMP_PTXAS=1`` (read at each compile) it writes, per kernel it compiles,
``<name>_<n>.ptxas`` (``ptxas -v``) and ``<name>_<n>.resources.txt`` (the kernel's shared
memory scratch), beside its PTX and MLIR. ``recorded()`` sets both for the compiles inside it
(into a temporary directory; the persistent compilation cache off, since a cached executable
compiles nothing) and yields the list it fills with one ``MosaicKernel`` per kernel compiled.
Plain files and regular expressions: no GPU needed.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
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
    thread, and shared memory per block (its scratch, dynamic, + ptxas's static bytes)."""

    name: str
    registers: int
    spill_bytes: int
    smem_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


def read_dump(folder: str) -> list[MosaicKernel]:
    """The kernels of a Mosaic dump folder, in file name order."""
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
        for entry, res in entries.items():
            name = entry[:-len(KERNEL_SUFFIX)] if entry.endswith(KERNEL_SUFFIX) else entry
            out.append(MosaicKernel(name, res.registers, res.spill_bytes, scratch + res.static_shared_bytes))
    return out


@contextlib.contextmanager
def recorded() -> Iterator[list[MosaicKernel]]:
    """Yields a list filled, on leaving, with the Mosaic kernels compiled inside (see module doc)."""
    kernels: list[MosaicKernel] = []
    saved = {k: os.environ.get(k) for k in (DUMP_TO, DUMP_PTXAS)}
    cache = jax.config.jax_enable_compilation_cache
    with tempfile.TemporaryDirectory(prefix="rwkv7_mosaic_dump_") as folder:
        os.environ[DUMP_TO], os.environ[DUMP_PTXAS] = folder, "1"
        jax.config.update("jax_enable_compilation_cache", False)
        try:
            yield kernels
        finally:
            jax.config.update("jax_enable_compilation_cache", cache)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            kernels.extend(read_dump(folder))


def summary(kernels: list[MosaicKernel]) -> list[dict]:
    """Per kernel name: compiles, registers min-max, the most spill bytes and shared memory."""
    by_name: dict[str, list[MosaicKernel]] = {}
    for k in kernels:
        by_name.setdefault(k.name, []).append(k)
    return [{"name": name, "compiles": len(ks), "registers": [min(k.registers for k in ks), max(k.registers for k in ks)],
             "max_spill_bytes": max(k.spill_bytes for k in ks), "smem_bytes": [min(k.smem_bytes for k in ks),
                                                                               max(k.smem_bytes for k in ks)]}
            for name, ks in sorted(by_name.items())]
