"""PyTorch reference RWKV-7 with Triton kernels, plus framework-free checkpoint I/O.

Importing this package does not import torch: the checkpoint and config modules are
numpy-only (the JAX model uses them), and the model is loaded lazily on first use.
"""
from .checkpoint import CheckpointError, read_checkpoint, random_tensors, write_checkpoint, write_random_checkpoint
from .config import NAMED_CONFIGS, ModelConfig, named_config

__all__ = ["CheckpointError", "ModelConfig", "NAMED_CONFIGS", "load", "named_config",
           "random_tensors", "read_checkpoint", "write_checkpoint", "write_random_checkpoint"]


def __getattr__(name: str):
    if name == "load":
        from .model import load
        return load
    raise AttributeError(f"module 'rwkv_torch_ref' has no attribute {name!r}")
