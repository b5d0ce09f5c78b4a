"""The spec-exact PyTorch reference of RWKV-7, its Triton kernels and its engine.

    m = rwkv_torch_ref.load(path, dtype="float32", kernels="torch")   # torch | triton | auto

Importing this package does not import torch: ``load`` and ``Kernels`` are loaded on
first use. Checkpoint I/O and the config live in the numpy-only ``rwkv7_core``.
"""

__all__ = ["Kernels", "load"]


def __getattr__(name: str):
    if name in __all__:
        from . import model
        return getattr(model, name)
    raise AttributeError(f"module 'rwkv_torch_ref' has no attribute {name!r}")
