"""Which kernels implement the ops: the ``Kernels`` choice, resolved in one place.

``Kernels.AUTO`` becomes what ``AUTO_CHOICE`` declares for the backend (``resolve``, called by
``rwkv_jax.Model``): on a GPU ``PALLAS_FUSED`` guarded by an on-device self-check against XLA
(``rwkv_jax.self_check``; ``PALLAS`` with one log line saying why when it fails), ``XLA``
elsewhere; naming a kernel choice forces it. ``ops_for(path, kernels)`` returns the ``Ops`` a path runs;
``sampler_form(kernels)`` says which form of the sampler's search the decode step uses.
``MOSAIC`` (+ ``_INTERPRET``) runs the ``pallas-fused`` decode with the ops that have a Pallas
Mosaic GPU kernel swapped in (``rwkv_jax.mosaic_ops``, its ``MOSAIC_TABLE`` says which op runs
where); it needs jax >= ``MOSAIC_MIN_JAX`` (declared in ``REQUIRES``: naming it on an older jax
raises ``KernelsUnavailable``).
"""
from __future__ import annotations

import enum
import logging
from typing import Callable, NamedTuple

import jax

from .ops import XLA_OPS, Ops
from .paths import Path
from .sampling import SearchForm


class Kernels(str, enum.Enum):
    """XLA: plain jnp ops; PALLAS: the Pallas kernels; PALLAS_INTERPRET: the same kernels run
    by the Pallas interpreter (any backend, for checks); PALLAS_FUSED (+ _INTERPRET): the
    fewer-launch decode kernels (``rwkv_jax.pallas_ops.fused_ops``); MOSAIC (+ _INTERPRET, the
    Mosaic kernels in Mosaic GPU's interpret mode): those with the Mosaic GPU kernels swapped in
    (``rwkv_jax.mosaic_ops``); NATIVE: XLA with the matrix products of a few rows run by the
    native CPU kernels (``cpu_kernels``, built on first use; CPU only); AUTO: see ``AUTO_CHOICE``."""

    XLA = "xla"
    PALLAS = "pallas"
    PALLAS_INTERPRET = "pallas-interpret"
    PALLAS_FUSED = "pallas-fused"
    PALLAS_FUSED_INTERPRET = "pallas-fused-interpret"
    MOSAIC = "mosaic"
    MOSAIC_INTERPRET = "mosaic-interpret"
    NATIVE = "native"
    AUTO = "auto"

    @property
    def interpreted(self) -> bool:
        """Run by the Pallas interpreter (a check on any backend), not compiled for a GPU."""
        return self.value.endswith("-interpret")


class KernelsUnavailable(ValueError):
    """A kernel family this jax cannot run (``REQUIRES``)."""


# The oldest jax each family needs: Pallas Mosaic GPU's ``plgpu.kernel`` with GPU interpret mode
# (``InterpretGPUParams``) and the state refs (``jax.new_ref``) the Mosaic kernels update in place.
MOSAIC_MIN_JAX = (0, 11)
REQUIRES: dict[Kernels, tuple[int, int]] = {Kernels.MOSAIC: MOSAIC_MIN_JAX, Kernels.MOSAIC_INTERPRET: MOSAIC_MIN_JAX}


# The platforms a family runs on, where it does not run on all (its kernels exist only there).
PLATFORMS: dict[Kernels, tuple[str, ...]] = {Kernels.NATIVE: ("cpu",)}


def require_platform(kind: Kernels, platform: str) -> None:
    """Raise KernelsUnavailable (one line) if `kind` cannot run on `platform` ("cpu", "gpu", ...)."""
    allowed = PLATFORMS.get(kind)
    if allowed is not None and platform not in allowed:
        raise KernelsUnavailable(f"kernels={kind.value} runs only on {', '.join(allowed)}; this model is on {platform}")


def jax_version() -> tuple[int, int]:
    """(major, minor) of the installed jax."""
    major, minor = jax.__version__.split(".")[:2]
    return int(major), int(minor)


def require_available(kind: Kernels) -> None:
    """Raise KernelsUnavailable (one line naming the jax needed) if this jax cannot run `kind`."""
    need = REQUIRES.get(kind)
    if need is not None and jax_version() < need:
        raise KernelsUnavailable(f"kernels={kind.value} needs jax >= {need[0]}.{need[1]} (Pallas Mosaic GPU); "
                                 f"this is jax {jax.__version__}")


class Guard(NamedTuple):
    """A choice adopted only once its self-check passes on this device, else the fallback."""

    preferred: Kernels
    fallback: Kernels


# What AUTO becomes per backend (declared, not probed). The fused decode path compiles to ~8
# launches a layer against ~44 (benchmarks/results/decode_nodes.md) but had never run on a
# GPU: guarded. DENSE runs the same kernels under both. On the CPU the native kernels are built
# on first use by the host's C++ compiler: guarded, so a host without one (or whose build
# fails) runs XLA with one log line saying why.
AUTO_CHOICE: dict[str, Kernels | Guard] = {"gpu": Guard(Kernels.PALLAS_FUSED, Kernels.PALLAS),
                                           "cpu": Guard(Kernels.NATIVE, Kernels.XLA)}

SelfCheck = Callable[[Kernels], "str | None"]  # candidate -> None if it passes, else why not
log = logging.getLogger(__name__)


def guarded(guard: Guard, self_check: SelfCheck | None) -> Kernels:
    """guard.preferred if self_check passes it, else guard.fallback (logged with the reason);
    without a self_check (no model to check) the fallback."""
    if self_check is None:
        return guard.fallback
    reason = self_check(guard.preferred)
    if reason is None:
        return guard.preferred
    log.warning("kernels=auto: %s failed its self-check on this device (%s); using %s",
                guard.preferred.value, reason, guard.fallback.value)
    return guard.fallback


def resolve(kernels: str | Kernels, self_check: SelfCheck | None = None) -> Kernels:
    """The concrete Kernels for a name (or member); AUTO as ``AUTO_CHOICE`` declares for the
    default backend (a Guard runs `self_check`, see `guarded`)."""
    try:
        kind = Kernels(kernels)
    except ValueError:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of "
                         f"{[k.value for k in Kernels]}") from None
    require_available(kind)
    if kind is not Kernels.AUTO:
        return kind
    choice = AUTO_CHOICE.get(jax.default_backend(), Kernels.XLA)
    return guarded(choice, self_check) if isinstance(choice, Guard) else choice


GPU_KERNELS = (Kernels.PALLAS, Kernels.PALLAS_FUSED, Kernels.MOSAIC)
INTERPRETED = (Kernels.PALLAS_INTERPRET, Kernels.PALLAS_FUSED_INTERPRET, Kernels.MOSAIC_INTERPRET)
FUSED = (Kernels.PALLAS_FUSED, Kernels.PALLAS_FUSED_INTERPRET)
MOSAIC = (Kernels.MOSAIC, Kernels.MOSAIC_INTERPRET)


def sampler_form(kernels: str | Kernels) -> SearchForm:
    """The form of the sampler's threshold search in the decode step of `kernels`. The GPU
    kernels sample with no device control flow (every row's draw computed), so XLA keeps the
    step one command buffer: PALLAS_FUSED and MOSAIC search with the Pallas radix passes (one
    launch a pass; ``kernels="auto"`` adopts it only once its self-check, which checks the search
    too, passes; MOSAIC runs the Triton-lowered search, see ``rwkv_jax.mosaic_ops``), PALLAS with XLA's unrolled passes (what auto falls back to). LOOP elsewhere (the
    CPU's XLA, the interpreters): greedy batches skip the draw with a lax.cond, where passes
    cost compute, not launches."""
    kind = resolve(kernels)
    if kind in (Kernels.PALLAS_FUSED, Kernels.MOSAIC):
        return SearchForm.PALLAS
    return SearchForm.UNROLLED if kind is Kernels.PALLAS else SearchForm.LOOP


def ops_for(path: Path, kernels: str | Kernels) -> Ops:
    """The Ops implementing ``path`` with the named kernels."""
    if not isinstance(path, Path):
        raise ValueError(f"path must be a rwkv_jax.Path, got {path!r}")
    kind = resolve(kernels)
    if kind is Kernels.XLA:
        return XLA_OPS
    if kind is Kernels.NATIVE:
        from .native_ops import native_ops
        return native_ops(path)
    # The Pallas Ops load only for Pallas runs; the Triton lowering is imported with any
    # rwkv_jax import, by the pallas_kernels modules whose reference ops rwkv_jax.ops uses.
    # The Mosaic Ops import Pallas Mosaic GPU, which jax < 0.11 lacks (resolve refused those).
    from .pallas_ops import fused_ops, pallas_ops
    interpret = kind in INTERPRETED
    if kind in MOSAIC:
        from .mosaic_ops import mosaic_ops
        return mosaic_ops(path, interpret=interpret)
    build = fused_ops if kind in FUSED else pallas_ops
    return build(path, interpret=interpret)
