"""Models and engines for the commands: seeded random models by name, and one engine per
backend (jax or torch, imported only when asked for)."""
from __future__ import annotations

import os
from pathlib import Path

from rwkv7_core.config import NAMED_CONFIGS, ModelConfig, named_config
from rwkv7_core.constants import WORLD_VOCAB_SIZE

BACKENDS = ("jax", "torch")
RANDOM_MODEL_SEED = 0


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/rwkv7 (default ~/.cache/rwkv7): random models, JAX's persistent compilation cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rwkv7"


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
    from rwkv7_core.random_weights import write_random_checkpoint

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
    if backend == "jax":
        from rwkv_jax import Kernels
    elif backend == "torch":
        try:
            from rwkv_torch_ref import Kernels
        except ModuleNotFoundError as e:
            raise ValueError(f"--backend torch needs {e.name}: pip install 'rwkv7-engine[torch]'") from None
    else:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return [k.value for k in Kernels]


def load_engine(backend: str, path: str | os.PathLike, dtype: str = "float32", kernels: str = "auto"):
    """The backend's engine for a checkpoint; ValueError for a bad backend, dtype or kernels
    (each backend's ``load`` checks its own kernels and resolves ``auto``)."""
    if backend == "jax":
        import rwkv_jax
        from rwkv_jax.engine import JaxEngine

        rwkv_jax.enable_compilation_cache(cache_dir() / "jax")  # reruns and resumed runs skip compiling
        return JaxEngine(rwkv_jax.load(path, dtype=dtype, kernels=kernels))
    if backend == "torch":
        try:
            import rwkv_torch_ref
            from rwkv_torch_ref.engine import TorchEngine
            model = rwkv_torch_ref.load(path, dtype=dtype, kernels=kernels)
        except ModuleNotFoundError as e:
            raise ValueError(f"--backend torch needs {e.name}: pip install 'rwkv7-engine[torch]'") from None
        return TorchEngine(model)
    raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
