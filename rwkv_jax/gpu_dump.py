"""What an XLA:GPU compile built, read from its dump (``compile(dump_options(DIR))``).

- ``step_report(dump_dir)``: every GPU operation one run of the executable issues, in
  order: kernel launches (name, grid, threads, dynamic shared memory) and device copies
  (HLO instruction, shape, bytes), from ``*.thunk_sequence.txt`` (one line per thunk,
  nesting by indentation: a kWhile body runs trip-count times, a kConditional one branch),
  ``*.thunk_metadata.txt`` (thunk id -> HLO instruction) and the optimized HLO (copy shapes);
  plus, per kernel, registers / spill bytes / static shared memory from ``ptxas -v`` on the
  dumped PTX (``ptxas_resources``).
- ``ptxas_resources(ptx_files)``: ``({entry name: PtxasResources}, errors)``, from the newest
  ptxas on the machine (``ptxas()``: the ``nvidia-cuda-nvcc`` wheel's, the ``triton``
  wheel's, CUDA's); it runs on any x86-64 CPU. A PTX file the ptxas cannot read is an error
  naming both versions, never a silently missing figure.

Plain Python and regular expressions: nothing here needs a GPU or the CUDA plugin.
"""
from __future__ import annotations

import collections
import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

CONTAINERS = {"kWhile", "kConditional", "kSequential", "kCommandBuffer"}
COPIES = {"kCopy", "kMemcpy", "kDeviceToDeviceCopy"}
_THUNK = re.compile(r"^(\s*)(\d+): (k\w+)\s+\[[^\]]*\]\s*(\S+)?"
                    r"(?: grid: \[(\d+), (\d+), (\d+)\] threads: \[(\d+), (\d+), (\d+)\]\s+shared_memory: (\d+) bytes)?")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
             "u32": 4, "f64": 8, "s64": 8, "u64": 8}


@dataclass(frozen=True)
class PtxasResources:
    """ptxas -v of one kernel entry: registers per thread, stack frame, spill stores + loads
    (bytes per thread) and static shared memory (bytes per block)."""

    registers: int
    stack_bytes: int
    spill_bytes: int
    static_shared_bytes: int


@dataclass
class Thunk:
    """One operation of the executable. ``kind`` is XLA's thunk kind (kCustomKernel, kCopy,
    ...); ``in_loop``: inside a kWhile (issued once per iteration); ``in_branch``: inside a
    kConditional (issued only when its branch is taken)."""

    id: int
    kind: str
    name: str | None
    in_loop: bool
    in_branch: bool
    grid: tuple | None = None
    threads: tuple | None = None
    shared_bytes: int = 0
    hlo: str | None = None
    shape: str | None = None
    bytes: int = 0


@dataclass
class KernelRow:
    """One distinct kernel of an executable: its launches per run and its resources
    (registers / spills / static shared memory are None when ptxas did not run)."""

    name: str
    launches: int
    grid: tuple
    threads: tuple
    shared_bytes: int              # dynamic (launch) shared memory + static shared memory
    registers: int | None = None
    spill_bytes: int | None = None
    stack_bytes: int | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "launches": self.launches, "grid": list(self.grid),
                "threads": list(self.threads), "registers": self.registers, "spill_bytes": self.spill_bytes,
                "stack_bytes": self.stack_bytes, "shared_bytes": self.shared_bytes}


@dataclass
class StepReport:
    """Everything one run of a compiled executable issues on the GPU.

    launches: kernel launches in issue order (a loop body counted once); copies: device
    copies; kernels: one KernelRow per distinct kernel name; ptxas_error: why resources are
    missing (None when ptxas ran)."""

    launches: list = field(default_factory=list)
    copies: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    ptxas_error: str | None = None
    while_loops: int = 0     # kWhile thunks: device loops (their bodies run trip-count times)
    conditionals: int = 0    # kConditional thunks: device branches on a device predicate

    @property
    def copy_bytes(self) -> int:
        return sum(c.bytes for c in self.copies)

    def launch_counts(self, prefix: str = "") -> dict:
        """{kernel name (without XLA's __N suffix): launches} for names starting with prefix."""
        return dict(collections.Counter(base_name(t.name) for t in self.launches
                                        if (t.name or "").startswith(prefix)))

    def summary(self) -> dict:
        """JSON-ready counts: launches (all, in loops, in conditional branches), device loops and
        conditionals, copies and bytes."""
        return {"launches": len(self.launches), "launches_in_loops": sum(t.in_loop for t in self.launches),
                "launches_in_branches": sum(t.in_branch for t in self.launches), "while_loops": self.while_loops,
                "conditionals": self.conditionals, "copies": len(self.copies),
                "copy_bytes": self.copy_bytes, "largest_copies": [
                    {"hlo": c.hlo, "shape": c.shape, "bytes": c.bytes}
                    for c in sorted(self.copies, key=lambda c: -c.bytes)[:3]]}


def dump_options(dump_dir: str) -> dict:
    """Compile options that dump what ``step_report`` reads into dump_dir. From jax 0.11 XLA
    writes PTX only for emitters matching ``xla_dump_emitter_re``; "ptx" selects exactly the
    PTX files (".*" adds LLVM IR of every emitter and makes compiles ~10x slower)."""
    return {"xla_dump_to": dump_dir, "xla_dump_emitter_re": "ptx"}


def base_name(name: str | None) -> str:
    """A kernel name without the __N suffix XLA adds to repeated names."""
    return re.sub(r"__\d+$", "", name or "")


def _one(dump_dir: str, pattern: str) -> str:
    files = sorted(glob.glob(os.path.join(dump_dir, pattern)), key=os.path.getsize)
    if not files:
        raise FileNotFoundError(f"no {pattern} in {dump_dir}: not an XLA:GPU dump of a finished compile")
    return files[-1]  # the largest: the executable's own module, not a helper compiled beside it


def parse_thunks(dump_dir: str) -> list[Thunk]:
    """Every thunk of the dumped executable, in order, with copy shapes and bytes: the leaves
    and the containers (``kind`` in CONTAINERS; no kernel name)."""
    sequence = _one(dump_dir, "*.thunk_sequence.txt")
    module = os.path.basename(sequence).rsplit(".thunk_sequence.txt", 1)[0]
    loops: list[int] = []  # indents of the enclosing loops
    branches: list[int] = []  # and conditionals
    thunks: list[Thunk] = []
    for line in open(sequence):
        m = _THUNK.match(line)
        if not m:
            continue
        indent, kind = len(m[1]), m[3]
        loops = [i for i in loops if i < indent]
        branches = [i for i in branches if i < indent]
        if kind == "kWhile":
            loops.append(indent)
        elif kind == "kConditional":
            branches.append(indent)
        t = Thunk(id=int(m[2]), kind=kind, name=m[4] if m[5] else None, in_loop=bool(loops),
                  in_branch=bool(branches))
        if m[5]:
            t.grid, t.threads, t.shared_bytes = tuple(map(int, m.group(5, 6, 7))), tuple(map(int, m.group(8, 9, 10))), int(m[11])
        thunks.append(t)
    meta = glob.glob(os.path.join(dump_dir, module + ".thunk_metadata.txt"))
    annotations = {}
    if meta:
        text = open(meta[0]).read()
        annotations = {int(i): a for a, i in re.findall(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)', text)}
    hlo = open(_one(dump_dir, module + ".sm_*gpu_after_optimizations.txt")).read()
    for t in thunks:
        t.hlo = annotations.get(t.id)
        if t.kind in COPIES and t.hlo:
            m = re.search(r"%" + re.escape(t.hlo) + r" = (\w+)\[([\d,]*)\]", hlo)
            if m:
                n = 1
                for d in filter(None, m[2].split(",")):
                    n *= int(d)
                t.shape, t.bytes = f"{m[1]}[{m[2]}]", n * _ITEMSIZE.get(m[1], 4)
    return thunks


PTXAS_ENV = "RWKV7_PTXAS"


def _ptxas_candidates() -> list[str]:
    """Every ptxas this machine has: ``$RWKV7_PTXAS``, the ``nvidia-cuda-nvcc`` wheel's (on
    sys.path, e.g. beside the CUDA plugin), the ``triton`` wheel's two, PATH's and CUDA's."""
    found = [os.environ.get(PTXAS_ENV, "")]
    for root in sys.path:
        found += glob.glob(os.path.join(root or ".", "nvidia", "cu*", "bin", "ptxas"))
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        triton_bin = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin")
        found += [os.path.join(triton_bin, "ptxas-blackwell"), os.path.join(triton_bin, "ptxas")]
    found += [shutil.which("ptxas") or "", "/usr/local/cuda/bin/ptxas"]
    return list(dict.fromkeys(p for p in found if p and os.access(p, os.X_OK)))


def _ptxas_version(exe: str) -> tuple:
    """(major, minor) of a ptxas's CUDA release, (0, 0) if it does not say."""
    run = subprocess.run([exe, "--version"], capture_output=True, text=True)
    m = re.search(r"release (\d+)\.(\d+)", run.stdout)
    return (int(m[1]), int(m[2])) if m else (0, 0)


@functools.lru_cache(maxsize=None)
def ptxas() -> tuple[str, tuple] | None:
    """(path, CUDA release) of the newest ptxas found, or None. The newest accepts the PTX
    of every older release; XLA writes PTX ISA 8.8 (jax 0.10-0.11, CUDA 12 plugin), 9.0
    (0.11, CUDA 13) or 9.4 (0.12), which need ptxas 12.9, 13.0 and 13.4 or newer."""
    versions = {exe: _ptxas_version(exe) for exe in _ptxas_candidates()}
    return max(versions.items(), key=lambda kv: kv[1], default=None)


def ptx_version(path: str) -> str:
    """The PTX ISA version a PTX file declares (``.version 9.0``), '?' if none."""
    with open(path) as f:
        m = re.search(r"^\.version (\S+)", f.read(4096), re.M)
    return m[1] if m else "?"


def ptxas_resources(ptx_files, arch: str = "sm_90a",
                    entry_prefix: str = "") -> tuple[dict[str, PtxasResources], list[str]]:
    """({entry: PtxasResources}, errors) for the kernel entries (starting with entry_prefix)
    of the PTX files, from the newest ptxas found; errors names each file ptxas rejected,
    with the PTX and ptxas versions. RuntimeError if no ptxas is found."""
    found = ptxas()
    if found is None:
        raise RuntimeError(f"no ptxas found: install nvidia-cuda-nvcc (or triton), or set {PTXAS_ENV}")
    exe, release = found
    out, errors = {}, []
    for path in ptx_files:
        entries = ptx_entries(path)
        if not any(e.startswith(entry_prefix) for e in entries):  # (XLA also writes empty modules)
            continue
        run = subprocess.run([exe, "-v", f"-arch={arch}", path, "-o", os.devnull], capture_output=True, text=True)
        text = run.stdout + run.stderr
        if run.returncode:
            errors.append(f"ptxas {release[0]}.{release[1]} ({exe}) rejected {os.path.basename(path)} "
                          f"(PTX ISA {ptx_version(path)}): {' '.join(text.split())[:300]}")
            continue
        out.update(parse_ptxas(text))
    return out, errors


def parse_ptxas(text: str) -> dict[str, PtxasResources]:
    """{entry name: PtxasResources} from the text of ``ptxas -v``."""
    out = {}
    for name, body in re.findall(r"Compiling entry function '(\w+)'.*?\n(.*?)(?=Compiling entry|\Z)", text, re.S):
        stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", body)
        regs = re.search(r"Used (\d+) registers", body)
        smem = re.search(r"(\d+) bytes smem", body)
        out[name] = PtxasResources(registers=int(regs[1]) if regs else 0, stack_bytes=int(stack[1]) if stack else 0,
                                   spill_bytes=int(stack[2]) + int(stack[3]) if stack else 0,
                                   static_shared_bytes=int(smem[1]) if smem else 0)
    return out


def ptx_entries(path: str) -> list[str]:
    """Kernel entry names defined in a PTX file."""
    with open(path) as f:
        return re.findall(r"\.entry (\w+)\(", f.read())


def step_report(dump_dir: str, ptxas: bool = True, entry_prefix: str = "", arch: str = "sm_90a") -> StepReport:
    """The StepReport of the one executable dumped in dump_dir. ptxas=True adds registers,
    spills and static shared memory of the kernels whose names start with entry_prefix
    ("" = every kernel; "rwkv7" = the Pallas kernels)."""
    thunks = parse_thunks(dump_dir)
    kinds = collections.Counter(t.kind for t in thunks)
    report = StepReport(launches=[t for t in thunks if t.kind not in COPIES | CONTAINERS],
                        copies=[t for t in thunks if t.kind in COPIES],
                        while_loops=kinds["kWhile"], conditionals=kinds["kConditional"])
    resources: dict[str, PtxasResources] = {}
    if ptxas:
        ptx_files = sorted(glob.glob(os.path.join(dump_dir, "*.ptx")))
        try:
            resources, errors = ptxas_resources(ptx_files, arch, entry_prefix)
            if not ptx_files:
                errors.append(f"no PTX in {dump_dir}: compile with dump_options(dir)")
            report.ptxas_error = "; ".join(errors) or None
        except RuntimeError as e:
            report.ptxas_error = str(e)
    rows: dict[str, KernelRow] = {}
    for t in report.launches:
        name = t.name or t.hlo or t.kind
        row = rows.get(name)
        if row is None:
            res = resources.get(name)
            rows[name] = KernelRow(name=name, launches=1, grid=t.grid or (), threads=t.threads or (),
                                   shared_bytes=t.shared_bytes + (res.static_shared_bytes if res else 0),
                                   registers=res.registers if res else None,
                                   spill_bytes=res.spill_bytes if res else None,
                                   stack_bytes=res.stack_bytes if res else None)
        else:
            row.launches += 1
    report.kernels = list(rows.values())
    return report
