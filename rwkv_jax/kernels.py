"""Which kernels implement the ops: the ``Kernels`` choice, resolved in one place.

``Kernels.AUTO`` becomes what ``AUTO_CHOICE`` declares for the backend (``resolve``, called by
``rwkv_jax.Model``): on a GPU ``PALLAS_FUSED`` guarded by an on-device self-check against XLA
(``rwkv_jax.self_check``; ``PALLAS`` with one log line saying why when it fails), ``XLA``
elsewhere; naming a kernel choice forces it. ``ops_for(path, kernels)`` returns the ``Ops`` a path runs;
``sampler_form(kernels)`` says which form of the sampler's search the decode step uses.
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
    fewer-launch decode kernels (``rwkv_jax.pallas_ops.fused_ops``); AUTO: see ``AUTO_CHOICE``."""

    XLA = "xla"
    PALLAS = "pallas"
    PALLAS_INTERPRET = "pallas-interpret"
    PALLAS_FUSED = "pallas-fused"
    PALLAS_FUSED_INTERPRET = "pallas-fused-interpret"
    AUTO = "auto"

    @property
    def interpreted(self) -> bool:
        """Run by the Pallas interpreter (a check on any backend), not compiled for a GPU."""
        return self.value.endswith("-interpret")


class Guard(NamedTuple):
    """A choice adopted only once its self-check passes on this device, else the fallback."""

    preferred: Kernels
    fallback: Kernels


# What AUTO becomes per backend (declared, not probed). The fused decode path compiles to ~8
# launches a layer against ~44 (benchmarks/results/decode_nodes.md) but had never run on a
# GPU: guarded. DENSE runs the same kernels under both.
AUTO_CHOICE: dict[str, Kernels | Guard] = {"gpu": Guard(Kernels.PALLAS_FUSED, Kernels.PALLAS)}

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
    if kind is not Kernels.AUTO:
        return kind
    choice = AUTO_CHOICE.get(jax.default_backend(), Kernels.XLA)
    return guarded(choice, self_check) if isinstance(choice, Guard) else choice


GPU_KERNELS = (Kernels.PALLAS, Kernels.PALLAS_FUSED)


def sampler_form(kernels: str | Kernels) -> SearchForm:
    """The form of the sampler's threshold search in the decode step of `kernels`. The GPU
    kernels sample with no device control flow (every row's draw computed), so XLA keeps the
    step one command buffer: PALLAS_FUSED searches with the Pallas radix passes (one launch a
    pass; ``kernels="auto"`` adopts it only once its self-check, which checks the search too,
    passes), PALLAS with XLA's unrolled passes (what auto falls back to). LOOP elsewhere (the
    CPU's XLA, the interpreters): greedy batches skip the draw with a lax.cond, where passes
    cost compute, not launches."""
    kind = resolve(kernels)
    if kind is Kernels.PALLAS_FUSED:
        return SearchForm.PALLAS
    return SearchForm.UNROLLED if kind is Kernels.PALLAS else SearchForm.LOOP


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
