"""``rwkv7-generate --ray ADDRESS|local``: the replicas as Ray actors, driven as one scheduler.

``RayReplicaSet`` is a ``ReplicaSet`` (replica_set.py: routing, retries, taking a
replica out, exactly-once delivery) whose replicas are ``ReplicaActor`` processes
(ray_actor.py), one per GPU (``num_gpus=1``) when the cluster has GPUs, else one
per CPU (``num_cpus=1``). Each replica's scheduler is an ``ActorScheduler``: the whole
scheduler interface over its actor, driven by the set's replica thread like a local one,
so rwkv7-generate and rwkv7-serve run on it as on one scheduler. The driver streams
requests to the actors (rwkv7-generate's window bounds the work in flight), polls each for
its events, and writes every result itself, so the output file's exactly-once and resume
guarantees are those of a local run. An actor that dies (killed, node lost) or reports a
broken engine is taken out (``ReplicaLost``) and its requests re-run on the others from
their prompts; an actor that cannot load the model is a clear error. Actors are named ``rwkv7-generate-<driver pid>-<i>`` in the ``rwkv7`` namespace.

``local`` starts a Ray cluster inside this process: every CPU of the machine, no dashboard,
a small object store, on the loopback address.

Ray is an optional dependency (``rwkv7-engine[ray]``) and reads its settings when first
imported, so this module, the only one that imports it, does so inside its functions.
"""
from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, NoReturn

from rwkv7_core.engine import Engine
from rwkv7_core.tokenizer import tokenizer_for

from ..config import SchedulerConfig
from ..stats import Stats
from ..validation import check_group
from .build import replica_count
from .engine_guard import Fault
from .ray_actor import ReplicaActor
from .replica import Replica, ReplicaLost
from .replica_set import ReplicaSet

NAMESPACE = "rwkv7"
READY_TIMEOUT_S = 600.0
POLL_S = 0.05
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Set before Ray is first imported for a local cluster: no usage reporting, and Ray keeps
127.0.0.1 (instead of turning it into the machine's routable address) for every process."""


def connect(address: str) -> None:
    """Join the cluster at ``address``, or start one here for ``local`` (a loopback address
    gets the local settings too: a cluster started on 127.0.0.1 is joined there); a process
    already in a cluster stays in it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address == "local" or address.split(":")[0] in ("127.0.0.1", "localhost"):
        for key, value in LOCAL_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ModuleNotFoundError:
        raise ValueError("Ray is not installed: pip install 'rwkv7-engine[ray]'") from None
    if ray.is_initialized():
        return
    if address == "local":
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 _node_ip_address="127.0.0.1", namespace=NAMESPACE, configure_logging=False)
    else:
        try:
            ray.init(address=address, namespace=NAMESPACE, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ValueError(f"cannot join the Ray cluster: {e}") from None


class ActorScheduler:
    """One actor's scheduler seen from the driver, with the scheduler surface a ReplicaSet
    drives (``add``, ``add_group``, ``cancel``, ``score``, ``queue_sizes``, ``precompile``,
    ``unstarted``, ``decode_buckets``, ``run``, ``stats``). ``add`` and ``add_group``
    buffer (``run`` sends them with its next poll); ``cancel``, ``score`` and ``precompile``
    call the actor at once; ``queue_sizes``, ``unstarted``, ``decode_buckets``, ``guard``
    and ``stats`` are the actor's last reports. ``run`` raises ``ReplicaLost`` when the
    actor dies or reports it cannot go on (the actor is killed first)."""

    def __init__(self, actor, config, logprobs_unsupported: str | None):
        self.actor, self.config, self.logprobs_unsupported = actor, config, logprobs_unsupported
        self.stats = Stats()  # the actor's, as last fetched
        self.guard = RemoteGuard()
        self.bucket = 0  # the actor's decode bucket
        self.lock = threading.Lock()
        self.pending: list = []        # Requests (add) and lists of them (add_group) not sent yet
        self.outstanding: set[str] = set()  # ids added and not finished
        self.waiting: set[str] = set()      # ids not started, as of the last poll
        self.sizes = dict.fromkeys(("waiting", "prefill", "ready", "running"), 0)

    def add(self, request) -> None:
        with self.lock:
            self.pending.append(request)
            self.outstanding.add(request.id)

    def add_group(self, requests) -> None:
        check_group(requests)
        with self.lock:
            self.pending.append(list(requests))
            self.outstanding.update(r.id for r in requests)

    def cancel(self, request_id: str) -> None:
        self._flush()  # an add still buffered reaches the actor before its cancel
        self.actor.cancel.remote(request_id)

    def score(self, tokens):
        import ray

        return ray.get(self.actor.score.remote(list(tokens)))

    def precompile(self) -> None:
        import ray

        ray.get(self.actor.precompile.remote())

    def queue_sizes(self) -> dict[str, int]:
        with self.lock:
            return {**self.sizes, "waiting": self.sizes["waiting"] + sum(map(_count, self.pending))}

    def decode_buckets(self) -> list[int]:
        return [self.bucket]

    def unstarted(self) -> list[str]:
        with self.lock:
            return list(self.waiting | {r.id for item in self.pending for r in _requests_of(item)})

    def run(self, on_token=None, on_finish=None, should_stop=None, on_logprobs=None, serve_until=None) -> None:
        """``Scheduler.run``'s contract, over the actor: send the buffered adds, poll, call the
        callbacks (in this thread) for its events, until every added request is reported (or,
        after ``should_stop()``, only unstarted ones are left). The actor's stats are fetched
        when it returns."""
        try:
            while True:
                stop = should_stop is not None and should_stop()
                report = self._poll(stop)
                for kind, request_id, payload in report["events"]:
                    if kind == "finish":
                        with self.lock:
                            self.outstanding.discard(request_id)
                        if on_finish is not None:
                            on_finish(payload)
                    elif kind == "token" and on_token is not None:
                        on_token(request_id, payload)
                    elif kind == "logprobs" and on_logprobs is not None:
                        on_logprobs(request_id, payload)
                if report["failed"] is not None:
                    self._lose(report["failed"])
                with self.lock:
                    idle = not self.outstanding or (stop and self.outstanding <= self.waiting)
                if idle and (serve_until is None or serve_until()):
                    return
        finally:
            self._fetch_stats()

    def _flush(self) -> None:
        with self.lock:
            adds, self.pending = self.pending, []
        if adds:
            self.actor.submit.remote(adds)

    def _poll(self, stop: bool) -> dict:
        """Send the buffered adds and take the actor's report (``ReplicaActor.poll``)."""
        import ray

        self._flush()
        try:
            report = ray.get(self.actor.poll.remote(POLL_S, stop))
        except ray.exceptions.RayError as e:
            self._lose(f"its actor died: {_first_line(e)}")
        self.guard.raised, self.guard.worst_streak = report["raised"], report["worst_streak"]
        with self.lock:
            self.waiting = set(report["unstarted"])
            self.sizes, self.bucket = report["queue_sizes"], report["bucket"]
        return report

    def _lose(self, reason: str) -> NoReturn:
        import ray

        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass
        raise ReplicaLost(reason)

    def _fetch_stats(self) -> None:
        import ray

        now = time.time() - time.perf_counter()
        try:
            stats, clock = ray.get(self.actor.stats.remote(), timeout=60)
        except (ray.exceptions.RayError, TimeoutError):
            return
        stats.shift_times(clock - now)  # onto this process's perf_counter
        self.stats = stats


def _requests_of(item) -> list:
    return item if isinstance(item, list) else [item]


def _count(item) -> int:
    return len(_requests_of(item))


class RemoteGuard:
    """An actor's engine-exception counters as of its last poll (EngineGuard's fields)."""

    def __init__(self):
        self.raised = 0
        self.worst_streak = 0


class RayReplicaSet(ReplicaSet):
    """A ReplicaSet whose replicas are actors (see the module docstring): ``infos`` are the
    actors' ``ready()`` reports; ``engine`` holds the actors' engine facts, ``tokenizer``
    comes from their vocabulary."""

    def __init__(self, actors: list, infos: list[dict], config, notify=None):
        replicas = []
        for i, (actor, info) in enumerate(zip(actors, infos)):
            scheduler = ActorScheduler(actor, config, info["logprobs_unsupported"])
            replicas.append(Replica(i, scheduler, scheduler.guard, info["device"]))
        facts = SimpleNamespace(**infos[0]["engine"])
        super().__init__(replicas, facts, tokenizer_for(facts.vocab_size), notify)


def _first_line(error: Exception) -> str:
    lines = [x for x in str(error).splitlines() if x.strip()]
    return lines[0] if lines else type(error).__name__


def ray_replica_set(address: str, data_parallel: str, load_engine: Callable[[], Engine],
                    config: SchedulerConfig) -> RayReplicaSet:
    """Start ``data_parallel`` (a count or "auto": one per GPU) actors on the cluster at
    ``address`` (``connect``), each loading its engine with ``load_engine()`` (picklable: it
    runs in the actor's process), and wait until each has loaded the model; ValueError (a
    clear message) when the cluster lacks the resources or an actor cannot load the model."""
    connect(address)  # before Ray is imported: it reads its settings once
    import ray

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    n = replica_count(data_parallel) or gpus or 1
    kind, have = ("GPU", gpus) if gpus else ("CPU", int(resources.get("CPU", 0)))
    if n > have:
        raise ValueError(f"--data-parallel {n} needs {n} {kind}s, the cluster has {have}")
    fault = Fault.from_env()
    options = {"num_gpus": 1} if gpus else {"num_cpus": 1}
    remote = ray.remote(max_restarts=0, max_task_retries=0, **options)(ReplicaActor)
    config_fields: dict[str, Any] = {**config._asdict(),
                                     "prefill_policy": getattr(config.prefill_policy, "value", config.prefill_policy)}
    actors = [remote.options(name=f"rwkv7-generate-{os.getpid()}-{i}").remote(
        load_engine, config_fields, tuple(fault._replace(replica=0)) if fault and fault.of_replica(i) else None)
        for i in range(n)]
    try:
        infos = ray.get([a.ready.remote() for a in actors], timeout=READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise ValueError(f"the {n} actors did not start within {READY_TIMEOUT_S:.0f} s") from None
    except ray.exceptions.RayError as e:
        raise ValueError(f"an actor could not load the model: {_cause(e)}") from None
    return RayReplicaSet(actors, infos, config)


def _cause(error: Exception) -> str:
    """The innermost error line of an actor's creation failure."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    errors = [x for x in lines if "Error:" in x or "Exception:" in x]
    return errors[-1] if errors else (lines[-1] if lines else type(error).__name__)

