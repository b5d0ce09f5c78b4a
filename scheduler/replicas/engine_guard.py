"""The engine as a replica sees it: ``EngineGuard`` counts the exceptions of each engine
call kind (scheduler/replicas/replica_set.py takes a replica out on a streak of them) and can inject a
``Fault``.

Fault injection (tests only): ``RWKV7_REPLICA_FAULT=R:KIND:N`` makes replica R (a single
engine is replica 0) fail after N successful calls; KIND ``engine``: every later decode step
raises RuntimeError; KIND ``thread``: the thread running the decode steps dies (an exception
the scheduler does not catch); KIND ``prefill``: the thread running the prefill calls dies.
"""
from __future__ import annotations

import os
from typing import NamedTuple

FAULT_ENV = "RWKV7_REPLICA_FAULT"
GUARDED_CALLS = ("step", "prefill", "prefill_varlen", "mixed_step", "insert", "resize", "sample")
FAULT_KINDS = {"engine": ("step",), "thread": ("step",), "prefill": ("prefill", "prefill_varlen")}


class Fault(NamedTuple):
    """An injected failure (see the module docstring)."""
    replica: int
    kind: str   # a key of FAULT_KINDS
    after_calls: int

    @classmethod
    def from_env(cls) -> "Fault | None":
        text = os.environ.get(FAULT_ENV)
        if not text:
            return None
        try:
            replica, kind, steps = text.split(":")
            fault = cls(int(replica), kind, int(steps))
        except ValueError:
            fault = None
        if fault is None or fault.kind not in FAULT_KINDS:
            raise ValueError(f"{FAULT_ENV}={text!r}: expected REPLICA:{'|'.join(FAULT_KINDS)}:CALLS")
        return fault

    def of_replica(self, index: int) -> "Fault | None":
        """This fault if it is replica ``index``'s, else None."""
        return self if self.replica == index else None


class InjectedThreadDeath(BaseException):
    """Raised by an injected ``thread`` fault: not an Exception, so nothing catches it."""


class EngineGuard:
    """An engine seen through the replica layer: forwards everything (the contract's declared
    facts explicitly, the rest through ``__getattr__``), and counts the exceptions of each guarded
    call kind (``raised``: total; ``consecutive``: since that kind last succeeded).
    Optionally injects a ``Fault``."""

    def __init__(self, engine, fault: Fault | None = None):
        self.engine = engine
        self.raised = 0
        self.consecutive: dict[str, int] = {}
        self._fault = fault
        self._calls = 0  # of the call kinds the fault counts

    # the contract's declared facts (rwkv7_core.engine.Engine), forwarded as they are
    capabilities = property(lambda self: self.engine.capabilities)
    config = property(lambda self: self.engine.config)
    dtype = property(lambda self: self.engine.dtype)
    kernels = property(lambda self: self.engine.kernels)
    device = property(lambda self: self.engine.device)
    prefill_pieces = property(lambda self: self.engine.prefill_pieces)

    def __getattr__(self, name: str):
        attr = getattr(self.engine, name)  # AttributeError for a capability the engine lacks
        if name not in GUARDED_CALLS:
            return attr

        def guarded(*args, **kwargs):
            try:
                if self._fault is not None and name in FAULT_KINDS[self._fault.kind]:
                    self._maybe_fail()
                result = attr(*args, **kwargs)
            except Exception:
                self.raised += 1
                self.consecutive[name] = self.consecutive.get(name, 0) + 1
                raise
            self.consecutive[name] = 0
            return result
        return guarded

    def _maybe_fail(self) -> None:
        self._calls += 1
        fault = self._fault
        if self._calls > fault.after_calls:
            if fault.kind == "engine":
                raise RuntimeError(f"injected engine fault after {fault.after_calls} steps")
            if fault.kind == "prefill":
                raise InjectedThreadDeath(f"injected prefill thread death after {fault.after_calls} prefill calls")
            raise InjectedThreadDeath(f"injected thread death after {fault.after_calls} steps")

    @property
    def worst_streak(self) -> int:
        return max(self.consecutive.values(), default=0)
