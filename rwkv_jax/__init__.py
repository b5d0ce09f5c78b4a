"""RWKV-7 in JAX/Flax: the XLA model, shape-based kernel paths and the kernel-op contract.

Importing this package never imports torch.
"""
from .compilation import enable_compilation_cache
from .forward import forward_fn, varlen_forward_fn
from .kernels import Kernels, ops_for
from .model import Model, load, local_device
from .ops import Ops
from .paths import Path, select_path
from .state import State, init_state

__all__ = ["Kernels", "Model", "Ops", "Path", "State", "enable_compilation_cache", "forward_fn",
           "init_state", "load", "local_device", "ops_for", "select_path", "varlen_forward_fn"]
