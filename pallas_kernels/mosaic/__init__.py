"""Pallas Mosaic GPU versions of the decode kernels (``kernels="mosaic"``; jax >= 0.11).

Each file holds one ``plgpu.kernel`` with the contract of the Triton-lowered kernel of the same
name one level up (same arguments, same reference); ``common`` holds the GPU interpret-mode
switches. ``rwkv_jax.mosaic_ops`` wires them in and declares, per op, which ones still run
the Triton kernel or XLA and why.
"""
