"""Compile the engine's executables for a described GPU with no GPU present ("deviceless").

XLA compiles for a GPU from its description alone (``rwkv_jax/gpu_targets/*.txtpb``, XLA's
``GpuTargetConfig`` text format): ``target_device(target)`` makes a compile-only device from
it, ``abstract_engine`` builds a ``JaxEngine`` whose weights are ShapeDtypeStructs placed on
that device (no weights are made), and ``compile_bucket`` compiles exactly what the engine
runs for a bucket and reports what was built (``rwkv_jax.gpu_dump.step_report``):

- ``Bucket("step", B, 1)``: the decode step with on-device sampling (``JaxEngine.lower(("step", B))``);
- ``Bucket("prefill", 1, T)``: one prompt piece of T tokens (``("prefill", T)``);
- ``Bucket("forward", B, T)``: the model forward over B x T tokens (``("forward", (B, T, False))``);
- ``Bucket("varlen", 1, T)`` / ``Bucket("mixed", B, T)``: the varlen prefill of T flat tokens
  and the mixed step of B slots plus T prompt tokens.

Needs a CUDA PJRT plugin of the installed jax: ``jax-cuda13-plugin`` + ``jax-cuda13-pjrt`` or
the ``cuda12`` pair, of the same version (no CUDA libraries). It may live outside the
environment (``pip install --target DIR ...``): name DIR with ``plugin_dir`` or the
``RWKV7_CUDA_PLUGIN_DIR`` variable; ``RWKV7_CUDA_PLUGIN=cuda12|cuda13`` picks one where DIR
holds both (default: cuda13 first); ``cuda_plugin()`` says which is loaded. Keep
``JAX_PLATFORMS=cpu`` so the CPU stays the default backend. Works on jax 0.10.2 to 0.12
(``on_target``, ``gpu_dump.dump_options``). Nothing here is imported by the rest of the package.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path as FsPath

import jax

from rwkv7_core.config import ModelConfig

from .engine import JaxEngine
from .gpu_dump import StepReport, base_name, dump_options, step_report  # noqa: F401 (base_name: re-exported)
from .kernels import Kernels
from .model import DTYPES, Model
from .paths import select_path
from .random_params import params_struct

TARGETS_DIR = FsPath(__file__).resolve().parent / "gpu_targets"
PLUGIN_DIR_ENV = "RWKV7_CUDA_PLUGIN_DIR"
MOSAIC_RUNTIME = "libmosaic_gpu_runtime.so"
KINDS = ("step", "prefill", "forward", "varlen", "mixed")


@dataclass(frozen=True)
class GpuTarget:
    """A GPU described by an XLA GpuTargetConfig text proto (``text``) and the facts read from it."""

    name: str
    text: str
    device: str                   # e.g. "NVIDIA H200 141GB HBM3e"
    compute_capability: tuple     # (9, 0)
    sm_count: int
    memory_bandwidth: float       # bytes/s
    shared_memory_optin: int      # bytes per block (opt-in limit)

    @property
    def arch(self) -> str:
        """ptxas architecture of the kernels XLA emits (sm_90a for compute capability 9.0)."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def targets() -> list[str]:
    """Names of the bundled target descriptions."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.txtpb"))


def load_target(name_or_path: str) -> GpuTarget:
    """A bundled target by name (``h200``, ``h100``) or a GpuTargetConfig .txtpb file."""
    path = FsPath(name_or_path)
    if not path.is_file():
        path = TARGETS_DIR / f"{name_or_path}.txtpb"
    if not path.is_file():
        raise ValueError(f"unknown GPU target {name_or_path!r}: choose one of {targets()} or give a .txtpb file")
    text = path.read_text()

    def number(key: str) -> int:
        m = re.search(rf"\b{key}: (\d+)", text)
        if not m:
            raise ValueError(f"GPU target {path} has no {key}")
        return int(m[1])

    cc = re.search(r"cuda_compute_capability \{\s*major: (\d+)\s*minor: (\d+)", text)
    device = re.search(r'device_description_str: "([^"]*)"', text)
    return GpuTarget(name=path.stem, text=text, device=device[1] if device else path.stem,
                     compute_capability=(int(cc[1]), int(cc[2])) if cc else (0, 0),
                     sm_count=number("core_count"), memory_bandwidth=float(number("memory_bandwidth")),
                     shared_memory_optin=number("shared_memory_per_block_optin"))


CUDA_PLUGINS = ("cuda13", "cuda12")
"""jax's CUDA PJRT plugins (``jax-<name>-plugin`` + ``jax-<name>-pjrt``), in order of preference."""
PLUGIN_ENV = "RWKV7_CUDA_PLUGIN"


def plugin_names() -> tuple[str, ...]:
    """The plugins to try: the one ``$RWKV7_CUDA_PLUGIN`` names, else every known one."""
    named = os.environ.get(PLUGIN_ENV)
    if named and named not in CUDA_PLUGINS:
        raise ValueError(f"{PLUGIN_ENV}={named!r}: choose one of {CUDA_PLUGINS}")
    return (named,) if named else CUDA_PLUGINS


def cuda_plugin() -> str | None:
    """'jax-cuda13-plugin 0.11.2'-style name of the CUDA plugin jax has loaded, or None."""
    for name in CUDA_PLUGINS:
        module = sys.modules.get(f"jax_plugins.xla_{name}")
        if module is not None:
            try:
                version = importlib.import_module(f"jax_plugins.xla_{name}.version").__version__
            except (ImportError, AttributeError):
                version = "?"
            return f"jax-{name}-plugin {version}"
    return None


def _register_cuda_plugin(plugin_dir: str | None) -> bool:
    """Put plugin_dir on sys.path and register the first CUDA plugin found there with jax."""
    if not plugin_dir or not os.path.isdir(plugin_dir):
        return False
    if plugin_dir not in sys.path:
        sys.path.insert(0, plugin_dir)
    importlib.invalidate_caches()
    for name in plugin_names():
        try:
            plugin = importlib.import_module(f"jax_plugins.xla_{name}")
        except ImportError:
            continue
        plugin.initialize()  # the plugin's registration entry point (what jax calls at discovery)
        _load_mosaic_runtime(os.path.join(plugin_dir, f"jax_{name}_plugin"))
        return True
    return False


def _load_mosaic_runtime(folder: str) -> None:
    """Load the plugin's Mosaic GPU runtime (global symbols) where it ships one: a Pallas Mosaic
    GPU kernel's compile links against its ``mosaic_gpu_launch_kernel`` (without it: "Symbols not
    found"); jax loads it only on a machine with a GPU."""
    path = os.path.join(folder, MOSAIC_RUNTIME)
    if os.path.isfile(path):
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


@functools.lru_cache(maxsize=None)
def _topology(target: GpuTarget, plugin_dir: str | None):
    from jax.experimental import topologies

    def make():
        return topologies.get_topology_desc(platform="cuda", topology="1x1x1", target_config=target.text)

    try:
        return make()
    except NotImplementedError:  # jax has no CUDA plugin (yet): register the one in plugin_dir
        if not _register_cuda_plugin(plugin_dir):
            v = jax.__version__
            raise RuntimeError(
                f"deviceless GPU compiles need a CUDA plugin of jax {v} ({' or '.join(plugin_names())}): "
                f"pip install --no-deps --target DIR jax-cuda13-plugin=={v} jax-cuda13-pjrt=={v} "
                f"(or the cuda12 pair) and set {PLUGIN_DIR_ENV}=DIR") from None
        return make()


def target_device(target: GpuTarget, plugin_dir: str | None = None):
    """A sharding placing arrays on a compile-only device of ``target`` (one GPU)."""
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    topo = _topology(target, plugin_dir or os.environ.get(PLUGIN_DIR_ENV))
    return NamedSharding(topologies.make_mesh(topo, (1,), ("gpu",)), PartitionSpec())


@contextlib.contextmanager
def on_target(target: GpuTarget, plugin_dir: str | None = None):
    """Trace and lower inside this (``with on_target(t) as sharding:``) to compile for target.

    The target's mesh becomes the abstract mesh, so lowering rules that ask which GPU they
    compile for see it: from jax 0.11 the Pallas Triton lowering reads the device kind from
    the abstract mesh or the default device (a CPU here) and fails without it; 0.10 assumed
    compute capability 9.0. Yields ``target_device(target)``."""
    sharding = target_device(target, plugin_dir)
    with jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh):
        yield sharding


def placed(tree, sharding):
    """ShapeDtypeStructs of a pytree of arrays or structs, placed with ``sharding``."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def abstract_engine(config: ModelConfig, dtype: str, kernels: str | Kernels, target: GpuTarget,
                    plugin_dir: str | None = None) -> JaxEngine:
    """A JaxEngine over a Model whose params are ShapeDtypeStructs on ``target``'s device.

    Only lowering works on it (``engine.lower``): the arguments
    placed on the target device carry the whole computation there."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported; choose one of {sorted(DTYPES)}")
    params = placed(params_struct(config, DTYPES[dtype]), target_device(target, plugin_dir))
    return JaxEngine(Model(params, config, DTYPES[dtype], kernels))


@dataclass(frozen=True)
class Bucket:
    """One executable: kind (see the module doc), B rows, T tokens."""

    kind: str
    B: int
    T: int

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"bucket kind {self.kind!r} unknown; choose one of {KINDS}")
        if self.B < 1 or self.T < 1 or (self.kind == "step" and self.T != 1) or (
                self.kind in ("prefill", "varlen") and self.B != 1):
            raise ValueError(f"bad {self.kind} bucket B={self.B} T={self.T}")

    @classmethod
    def parse(cls, text: str) -> "Bucket":
        """``BxT`` (T=1: step; B=1: prefill; else forward), ``varlen:T`` or ``mixed:BxT``."""
        kind, _, shape = text.strip().rpartition(":")
        try:
            if kind == "varlen":
                return cls("varlen", 1, int(shape))
            B, T = (int(n) for n in shape.split("x"))
        except ValueError:
            raise ValueError(f"bad bucket {text!r}: expected BxT, varlen:T or mixed:BxT") from None
        if kind == "mixed":
            return cls("mixed", B, T)
        if kind:
            raise ValueError(f"bad bucket {text!r}: unknown kind {kind!r}")
        return cls("step" if T == 1 else "prefill" if B == 1 else "forward", B, T)

    @property
    def path(self) -> str:
        """The kernel path the executable's rows run (varlen and mixed run DENSE's ops)."""
        if self.kind in ("varlen", "mixed"):
            return "DENSE"
        return select_path(self.B, self.T).name

    def label(self) -> str:
        return {"varlen": f"varlen:{self.T}", "mixed": f"mixed:{self.B}x{self.T}"}.get(self.kind, f"{self.B}x{self.T}")

    @property
    def key(self) -> tuple:
        """The engine executable's key (``rwkv_jax.executables``)."""
        return {"step": ("step", self.B), "prefill": ("prefill", self.T), "forward": ("forward", (self.B, self.T, False)),
                "varlen": ("varlen_prefill", self.T), "mixed": ("mixed", (self.B, self.T))}[self.kind]


@dataclass
class BucketResult:
    """Outcome of one deviceless compile (``compiled`` and ``report`` are None on failure)."""

    bucket: Bucket
    ok: bool
    error: str | None = None
    compile_s: float = 0.0
    report: StepReport | None = None
    compiled: object = field(default=None, repr=False)

    def as_dict(self) -> dict:
        """The JSON row: B, T, kind, path, ok, error, compile_s, launches, copies, kernels."""
        row = {"B": self.bucket.B, "T": self.bucket.T, "kind": self.bucket.kind, "path": self.bucket.path,
               "ok": self.ok, "error": self.error, "compile_s": round(self.compile_s, 2)}
        if self.report is not None:
            row.update(self.report.summary())
            row["ptxas_error"] = self.report.ptxas_error
            row["kernels"] = [k.as_dict() for k in self.report.kernels]
        else:
            row.update(launches=None, kernels=[])
        return row


def compile_bucket(engine: JaxEngine, bucket: Bucket, target: GpuTarget, *, ptxas: bool = True,
                   entry_prefix: str = "", dump_dir: str | None = None, keep_compiled: bool = False) -> BucketResult:
    """Compile bucket's executable for target (dumped to dump_dir, or a temporary directory)
    and read its StepReport; a failing compile gives ok=False with XLA's message."""
    with tempfile.TemporaryDirectory(prefix="rwkv7_gpu_dump_") as tmp:
        dump = dump_dir or tmp
        start = time.perf_counter()
        try:
            with on_target(target):
                lowered = engine.lower(bucket.key)
            compiled = lowered.compile(dump_options(dump))
        except Exception as e:  # the compile's failure is the result
            message = " ".join(str(e).split())
            return BucketResult(bucket, False, f"{type(e).__name__}: {message[:2000]}", time.perf_counter() - start)
        seconds = time.perf_counter() - start
        report = step_report(dump, ptxas=ptxas, entry_prefix=entry_prefix, arch=target.arch)
    return BucketResult(bucket, True, None, seconds, report, compiled if keep_compiled else None)


def compile_function(fn, args, target: GpuTarget, *, plugin_dir: str | None = None, ptxas: bool = True,
                     entry_prefix: str = "") -> StepReport:
    """Compile ``jax.jit(fn)`` for target on args (a tuple of pytrees of arrays or structs,
    placed on the target device here) and return its StepReport; a failing compile raises."""
    with on_target(target, plugin_dir) as sharding, tempfile.TemporaryDirectory(prefix="rwkv7_gpu_dump_") as dump:
        lowered = jax.jit(fn).trace(*placed(args, sharding)).lower()
        lowered.compile(dump_options(dump))
        return step_report(dump, ptxas=ptxas, entry_prefix=entry_prefix, arch=target.arch)


def resource_problems(report: StepReport | None, target: GpuTarget, no_spill: bool) -> list[str]:
    """Kernels over the target's opt-in shared memory, or (no_spill) spilling registers."""
    problems = []
    for k in report.kernels if report else []:
        if k.shared_bytes > target.shared_memory_optin:
            problems.append(f"{k.name}: {k.shared_bytes} B shared memory > {target.shared_memory_optin} B")
        if no_spill and k.spill_bytes:
            problems.append(f"{k.name}: spills {k.spill_bytes} B ({k.registers} registers)")
    return problems


def serialize(compiled) -> bytes:
    """A compiled executable as bytes (``jax.experimental.serialize_executable``), to load on a
    GPU of the same jax version with ``deserialize``."""
    import pickle

    from jax.experimental import serialize_executable
    return pickle.dumps(serialize_executable.serialize(compiled))


def deserialize(blob: bytes, backend=None):
    """The executable of ``serialize`` loaded on ``backend`` (default: the default backend)."""
    import pickle

    from jax.experimental import serialize_executable
    payload, in_tree, out_tree = pickle.loads(blob)
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree, backend=backend)

