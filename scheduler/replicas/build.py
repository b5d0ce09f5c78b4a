"""Making a ReplicaSet of one Scheduler per engine, reading ``--data-parallel``, and the
per-replica reports of a set or a plain scheduler."""
from __future__ import annotations

from typing import Any

from rwkv7_core.engine import check_capabilities

from ..core import Scheduler
from .engine_guard import EngineGuard, Fault
from .replica import Replica
from .replica_set import ReplicaSet


def build_replica_set(engines: list, devices: list[str], config, tokenizer=None,
                      fault: Fault | None = None, prefix_store=None) -> ReplicaSet:
    """A ReplicaSet of one Scheduler per engine, each on an EngineGuard (``fault``, e.g.
    ``Fault.from_env()``, injected into its replica), all sharing ``prefix_store`` (the
    prefix cache's disk tier, or None). ValueError or TypeError as Scheduler raises them (e.g.
    a prefill policy the engine does not support, a capability it declares without its
    methods: checked on the engine itself, so the message names its class, not the guard)."""
    replicas = []
    for i, (engine, device) in enumerate(zip(engines, devices)):
        check_capabilities(engine)
        guard = EngineGuard(engine, fault and fault.of_replica(i))
        replicas.append(Replica(i, Scheduler(guard, config, tokenizer=tokenizer, prefix_store=prefix_store),
                                guard, device))
    return ReplicaSet(replicas, engines[0], tokenizer)


def replica_count(data_parallel: str | int) -> int | None:
    """``--data-parallel N|auto`` as a count (None for "auto"); ValueError unless N is a
    positive integer."""
    if data_parallel == "auto":
        return None
    try:
        n = int(data_parallel)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--data-parallel {data_parallel}: expected a positive integer or 'auto'")
    return n


def engine_device(engine) -> str:
    """A readable name of the device an engine runs on ("cpu:0", "cuda:1", ...; "default"
    for an engine on its framework's default device)."""
    return "default" if engine.device is None else engine.device


def replica_reports(sched) -> list[dict[str, Any]]:
    """Per-replica reports for the metrics: a ReplicaSet's replicas, or a plain Scheduler as one."""
    if isinstance(sched, ReplicaSet):
        return [r.report() for r in sched.replicas]
    stats = sched.stats
    return [{"device": engine_device(sched.engine), "requests": stats.requests_finished,
             "generated_tokens": stats.generated_tokens, "failed": None, "stats": stats}]
