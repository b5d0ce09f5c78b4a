"""RWKV-7 in JAX/Flax: the XLA model, shape-based kernel paths and the kernel-op contract.

Importing this package never imports torch.
"""
from .ops import Ops, ops_for
from .paths import Path, select_path

__all__ = ["Ops", "Path", "ops_for", "select_path"]
