"""RWKV-7 in JAX/Flax: the XLA model, shape-based kernel paths and the kernel-op contract.

Importing this package never imports torch.
"""
from .compilation import enable_compilation_cache
from .forward import forward_fn
from .model import Model, load
from .ops import Ops, ops_for
from .paths import Path, select_path
from .state import State, init_state

__all__ = ["Model", "Ops", "Path", "State", "enable_compilation_cache", "forward_fn", "init_state",
           "load", "ops_for", "select_path"]
