"""Models and engines for the commands: seeded random models by name, and one engine per
backend (jax or torch, imported only when asked for)."""
from __future__ import annotations

import enum
import os
from pathlib import Path

from rwkv7_core.config import NAMED_CONFIGS, ModelConfig, named_config
from rwkv7_core.constants import WORLD_VOCAB_SIZE
from rwkv7_core.random_weights import write_random_checkpoint
from scheduler.replicas.build import replica_count

BACKENDS = ("jax", "torch")
RANDOM_MODEL_SEED = 0


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/rwkv7 (default ~/.cache/rwkv7): random models, JAX's persistent compilation cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rwkv7"


def compile_cache_dir() -> Path:
    """JAX's persistent compilation cache: $JAX_COMPILATION_CACHE_DIR (JAX's own variable) when
    set, else cache_dir()/jax."""
    return Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache_dir() / "jax")


def random_model_names() -> list[str]:
    """The named shapes, plus NAME-world for those whose vocabulary is not the World one."""
    return sorted(NAMED_CONFIGS) + sorted(f"{n}-world" for n, c in NAMED_CONFIGS.items()
                                          if c.vocab_size != WORLD_VOCAB_SIZE)


def random_model_config(name: str) -> ModelConfig:
    if name.endswith("-world"):
        return named_config(name[:-len("-world")])._replace(vocab_size=WORLD_VOCAB_SIZE)
    return named_config(name)


def random_model_path(name: str) -> Path:
    """Write (once) and return a cached seeded random checkpoint of shape ``name``."""
    root = cache_dir()
    path = root / f"random-{name}-seed{RANDOM_MODEL_SEED}.safetensors"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.safetensors")
        write_random_checkpoint(tmp, random_model_config(name), seed=RANDOM_MODEL_SEED)
        os.replace(tmp, path)  # atomic: concurrent runs never see a half-written file
    return path


def kernel_choices(backend: str) -> list[str]:
    """The backend's ``Kernels`` values (imports that backend's package)."""
    kernel_enum: type[enum.Enum]
    # Backends are imported lazily in this module: --help runs without jax; torch is optional.
    if backend == "jax":
        import rwkv_jax

        kernel_enum = rwkv_jax.Kernels
    elif backend == "torch":
        try:
            import rwkv_torch_ref

            kernel_enum = rwkv_torch_ref.Kernels
        except ModuleNotFoundError as e:
            raise ValueError(f"--backend torch needs {e.name}: pip install 'rwkv7-engine[torch]'") from None
    else:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return [k.value for k in kernel_enum]


def load_engine(backend: str, path: str | os.PathLike, dtype: str = "float32", kernels: str = "auto",
                device=None, quantization: str = "none", group_size: int | None = None,
                state_dtype: str = "float32"):
    """The backend's engine for a checkpoint; ValueError for a bad backend, dtype, kernels or
    quantization (each backend's ``load`` checks its own kernels and resolves ``auto``). device:
    jax, an index into ``jax.local_devices()``; torch, a device string ("cuda:1", "cpu"); None =
    the backend's default. quantization: none | int8 | int4 | fp8 (``rwkv7_core.quantization``);
    group_size: int8 / int4 input channels per scale (None: the default, or a quantized checkpoint's);
    state_dtype: the wkv state's dtype (``rwkv7_core.state``)."""
    return load_engines(backend, path, dtype, kernels, [device], quantization, group_size, state_dtype)[0]


def load_node_engine(backend: str, model_path: str | None, random_model: str | None, dtype: str, kernels: str,
                     quantization: str = "none", group_size: int | None = None, state_dtype: str = "float32"):
    """``load_engine`` of ``model_path``, or of the seeded random model ``random_model``
    (written on this machine if missing): what a Ray actor runs on its own node."""
    path = random_model_path(random_model) if random_model else model_path
    return load_engine(backend, path, dtype, kernels, quantization=quantization, group_size=group_size,
                       state_dtype=state_dtype)

def load_engines(backend: str, path: str | os.PathLike, dtype: str, kernels: str, devices: list,
                 quantization: str = "none", group_size: int | None = None, state_dtype: str = "float32") -> list:
    """One engine per entry of ``devices`` (see ``load_engine``; ``replica_devices`` gives
    them). JAX reads the checkpoint once and puts a copy of the weights on each device."""
    if backend == "jax":  # lazy backend imports, as in kernel_choices
        import rwkv_jax
        from rwkv_jax.engine import JaxEngine

        rwkv_jax.enable_compilation_cache(compile_cache_dir())  # reruns and resumed runs skip compiling
        first = rwkv_jax.load(path, dtype=dtype, kernels=kernels, device=devices[0], quantization=quantization,
                               group_size=group_size, state_dtype=state_dtype)
        models = [first] + [rwkv_jax.Model(first.params, first.config, first.dtype, first.kernels,
                                           rwkv_jax.local_device(d), first.state_dtype) for d in devices[1:]]
        return [JaxEngine(m) for m in models]
    if backend == "torch":
        try:
            import rwkv_torch_ref
            from rwkv_torch_ref.engine import TorchEngine
            return [TorchEngine(rwkv_torch_ref.load(path, dtype=dtype, kernels=kernels, device=d,
                                                    quantization=quantization, group_size=group_size,
                                                    state_dtype=state_dtype))
                    for d in devices]
        except ModuleNotFoundError as e:
            raise ValueError(f"--backend torch needs {e.name}: pip install 'rwkv7-engine[torch]'") from None
    raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")


def replica_devices(backend: str, data_parallel: str | int) -> list:
    """The device of each replica for ``--data-parallel N|auto`` (``load_engines`` takes
    them): every local accelerator for ``auto`` (one replica on a CPU-only machine); on the
    CPU, N above the JAX device count shares the devices among replicas (one thread each).
    ValueError when N is not a positive integer or exceeds the accelerators there are."""
    n = replica_count(data_parallel)
    if backend == "jax":  # lazy backend imports, as in kernel_choices
        import jax

        devices = jax.local_devices()
        accelerator = devices[0].platform != "cpu"
        labels: list = list(range(len(devices)))
        if data_parallel == "auto":
            return labels if accelerator else [None]
        if n == 1:
            return [None]
    elif backend == "torch":
        try:
            import torch
        except ModuleNotFoundError as e:
            raise ValueError(f"--backend torch needs {e.name}: pip install 'rwkv7-engine[torch]'") from None
        accelerator = torch.cuda.is_available()
        labels = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if accelerator else ["cpu"]
        if data_parallel == "auto":
            return labels if accelerator else [None]
        if n == 1:
            return [None]
    else:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if accelerator and n > len(labels):
        raise ValueError(f"--data-parallel {n}: this machine has {len(labels)} {backend} accelerator(s)")
    return [labels[i % len(labels)] for i in range(n)]
