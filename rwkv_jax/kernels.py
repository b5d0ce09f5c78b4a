"""Which kernels implement the ops: the ``Kernels`` choice, resolved in one place.

``Kernels.AUTO`` becomes ``PALLAS`` on a GPU backend and ``XLA`` elsewhere (``resolve``,
called by ``rwkv_jax.load``); ``ops_for(path, kernels)`` returns the ``Ops`` a path runs;
``straight_line_sampling(kernels)`` says which form of the sampler the decode step uses.
"""
from __future__ import annotations

import enum

import jax

from .ops import XLA_OPS, Ops
from .paths import Path


class Kernels(str, enum.Enum):
    """XLA: plain jnp ops; PALLAS: the Pallas kernels; PALLAS_INTERPRET: the same kernels run
    by the Pallas interpreter (any backend, for checks); PALLAS_FUSED (+ _INTERPRET): the
    fewer-launch decode kernels (``rwkv_jax.pallas_ops.fused_ops``; selectable until shown
    faster on a GPU); AUTO: PALLAS on a GPU, else XLA."""

    XLA = "xla"
    PALLAS = "pallas"
    PALLAS_INTERPRET = "pallas-interpret"
    PALLAS_FUSED = "pallas-fused"
    PALLAS_FUSED_INTERPRET = "pallas-fused-interpret"
    AUTO = "auto"


def resolve(kernels: str | Kernels) -> Kernels:
    """The concrete Kernels for a name (or member); AUTO is decided by the default backend."""
    try:
        kind = Kernels(kernels)
    except ValueError:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of "
                         f"{[k.value for k in Kernels]}") from None
    if kind is Kernels.AUTO:
        return Kernels.PALLAS if jax.default_backend() == "gpu" else Kernels.XLA
    return kind


GPU_KERNELS = (Kernels.PALLAS, Kernels.PALLAS_FUSED)
QUANTIZED_KERNELS = (Kernels.XLA,)  # the kernels whose ops take a QuantizedWeight


def straight_line_sampling(kernels: str | Kernels) -> bool:
    """True for the GPU kernels: their decode step samples with no device control flow
    (``rwkv_jax.sampling``: every row's draw computed, unrolled radix passes), so XLA
    keeps the step one command buffer. Elsewhere (the CPU's XLA, the interpreters) greedy
    batches skip the draw with a lax.cond: cheaper where passes cost compute, not launches."""
    return resolve(kernels) in GPU_KERNELS


def ops_for(path: Path, kernels: str | Kernels) -> Ops:
    """The Ops implementing ``path`` with the named kernels."""
    if not isinstance(path, Path):
        raise ValueError(f"path must be a rwkv_jax.Path, got {path!r}")
    kind = resolve(kernels)
    if kind is Kernels.XLA:
        return XLA_OPS
    # The Pallas Ops load only for Pallas runs; the Triton lowering is imported with any
    # rwkv_jax import, by the pallas_kernels modules whose reference ops rwkv_jax.ops uses.
    from .pallas_ops import fused_ops, pallas_ops
    interpret = kind in (Kernels.PALLAS_INTERPRET, Kernels.PALLAS_FUSED_INTERPRET)
    build = fused_ops if kind in (Kernels.PALLAS_FUSED, Kernels.PALLAS_FUSED_INTERPRET) else pallas_ops
    return build(path, interpret=interpret)
