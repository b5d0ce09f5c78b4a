"""``rwkv7-generate --ray ADDRESS|local``: the replicas as Ray actors, driven as one scheduler.

``RayReplicaSet`` is a ``ReplicaSet`` (rwkv7_apps/replicas.py: routing, retries, taking a
replica out, exactly-once delivery) whose replicas are ``ReplicaActor`` processes
(rwkv7_apps/ray_actor.py), one per GPU (``num_gpus=1``) when the cluster has GPUs, else one
per CPU (``num_cpus=1``). The driver streams requests to them (rwkv7-generate's window bounds
the work in flight), polls each for tokens and results, and writes every result itself, so
the output file's exactly-once and resume guarantees are those of a local run. An actor
that dies (killed, node lost) or reports a broken engine is taken out and its requests
re-run on the others from their prompts; an actor that cannot load the model is a clear
error. Actors are named ``rwkv7-generate-<driver pid>-<i>`` in the ``rwkv7`` namespace.

``local`` starts a Ray cluster inside this process: every CPU of the machine, no dashboard,
a small object store, on the loopback address.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, is_dataclass
from .replicas import Fault, Replica, ReplicaSet

NAMESPACE = "rwkv7"
READY_TIMEOUT_S = 600.0
POLL_S = 0.05
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20
LOCAL_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Set before Ray is first imported for a local cluster: no usage reporting, and Ray keeps
127.0.0.1 (instead of turning it into the machine's routable address) for every process."""


def connect(address: str) -> None:
    """Join the cluster at ``address``, or start one here for ``local`` (a loopback address
    gets the local settings too: a cluster started on 127.0.0.1 is joined there)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address == "local" or address.split(":")[0] in ("127.0.0.1", "localhost"):
        for key, value in LOCAL_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import ray
    except ModuleNotFoundError:
        raise ValueError("Ray is not installed: pip install 'rwkv7-engine[ray]'") from None
    if address == "local":
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 _node_ip_address="127.0.0.1", namespace=NAMESPACE, configure_logging=False)
    else:
        try:
            ray.init(address=address, namespace=NAMESPACE, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ValueError(f"cannot join the Ray cluster: {e}") from None


class ActorScheduler:
    """The driver's view of one actor's scheduler: ``add`` buffers (``flush`` sends), ``cancel``
    is sent at once, ``unstarted`` and ``stats`` are the actor's last reports."""

    def __init__(self, actor, config):
        self.actor, self.config = actor, config
        self.pending: list[dict] = []
        self.waiting: set[str] = set()
        from scheduler.stats import Stats
        self.stats = Stats()  # the actor's, as last fetched

    def add(self, request) -> None:
        params = request.params
        self.pending.append({"id": request.id, "prompt_tokens": list(request.prompt_tokens),
                             "params": asdict(params) if is_dataclass(params) else dict(params)})
        self.waiting.add(request.id)

    def flush(self) -> None:
        if self.pending:
            self.actor.submit.remote(self.pending)
            self.pending = []

    def cancel(self, request_id: str) -> None:
        self.actor.cancel.remote(request_id)

    def unstarted(self) -> list[str]:
        return list(self.waiting)


class _RemoteGuard:
    """An actor's engine-exception counters as of its last poll (EngineGuard's fields)."""

    def __init__(self):
        self.raised = 0
        self.worst_streak = 0


class RayReplicaSet(ReplicaSet):
    """ReplicaSet over Ray actors; see the module docstring. ``vocab_size`` and ``tokenizer``
    come from the actors' model. It drives rwkv7-generate only (``add``, ``cancel``,
    ``unstarted``, ``run`` without ``on_logprobs`` / ``serve_until``, ``stats``): its actors
    have no ``add_group``, ``score``, ``queue_sizes`` or ``precompile`` yet."""

    def __init__(self, actors: list, devices: list[str], config, vocab_size: int, notify=None):
        from types import SimpleNamespace

        from rwkv7_core.tokenizer import tokenizer_for

        replicas = [Replica(i, ActorScheduler(a, config), _RemoteGuard(), d)
                    for i, (a, d) in enumerate(zip(actors, devices))]
        super().__init__(replicas, SimpleNamespace(vocab_size=vocab_size), tokenizer_for(vocab_size), notify)

    def run(self, on_token=None, on_finish=None, should_stop=None) -> None:
        """Drive the actors until every added request is reported (see ReplicaSet.run)."""
        import ray

        self._stopping = False
        polls: dict = {}
        try:
            while True:
                if not self._stopping and should_stop is not None and should_stop():
                    self._stopping = True
                    for r in self._healthy():
                        r.scheduler.actor.stop.remote()
                for r in self._healthy():
                    r.scheduler.flush()
                    if r.index not in polls.values():
                        polls[r.scheduler.actor.poll.remote(POLL_S)] = r.index
                if self._finished():
                    return
                ready, _ = ray.wait(list(polls), num_returns=1, timeout=POLL_S * 4)
                for ref in ready:
                    replica = self.replicas[polls.pop(ref)]
                    if replica.failed is not None:
                        continue
                    try:
                        report = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        self._lose(replica, f"its actor died: {_first_line(e)}")
                        continue
                    self._apply(replica, report, on_token, on_finish)
        finally:
            self._fetch_stats()

    def _apply(self, replica: Replica, report: dict, on_token, on_finish) -> None:
        from scheduler import RequestOutput

        replica.guard.raised, replica.guard.worst_streak = report["raised"], report["worst_streak"]
        replica.scheduler.waiting = set(report["unstarted"]) | {p["id"] for p in replica.scheduler.pending}
        for request_id, token in report["tokens"]:
            self._dispatch(("token", replica.index, request_id, token), on_token, None, on_finish)
        for fields in report["finished"]:
            self._dispatch(("finish", replica.index, fields["id"], RequestOutput(**fields)), on_token, None,
                           on_finish)
        if report["failed"] is not None and replica.failed is None:
            self._lose(replica, report["failed"])

    def _lose(self, replica: Replica, reason: str) -> None:
        import ray

        self._take_out(replica, reason)
        replica.scheduler.waiting = set()
        try:
            ray.kill(replica.scheduler.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _check_threads(self) -> None:  # actors, not threads: a dead one shows in its poll
        pass

    def _fetch_stats(self) -> None:
        import ray

        now = time.time() - time.perf_counter()
        for r in self._healthy():
            try:
                stats, clock = ray.get(r.scheduler.actor.stats.remote(), timeout=60)
            except (ray.exceptions.RayError, TimeoutError):
                continue
            stats.shift_times(clock - now)  # onto this process's perf_counter
            r.scheduler.stats = stats


def _first_line(error: Exception) -> str:
    lines = [x for x in str(error).splitlines() if x.strip()]
    return lines[0] if lines else type(error).__name__


def ray_replica_set(args, model_path, config) -> RayReplicaSet:
    """Start ``--data-parallel`` actors on the ``--ray`` cluster and wait until each has
    loaded the model; ValueError (a clear message) when the cluster lacks the resources or
    an actor cannot load the model."""
    connect(args.ray)  # before Ray is imported: it reads its settings once
    import ray

    from .ray_actor import ReplicaActor

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if args.data_parallel == "auto":
        n = gpus or 1
    else:
        try:
            n = int(args.data_parallel)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"--data-parallel {args.data_parallel}: expected a positive integer or 'auto'")
    kind, have = ("GPU", gpus) if gpus else ("CPU", int(resources.get("CPU", 0)))
    if n > have:
        raise ValueError(f"--data-parallel {n} needs {n} {kind}s, the cluster has {have}")
    fault = Fault.from_env()
    options = {"num_gpus": 1} if gpus else {"num_cpus": 1}
    remote = ray.remote(max_restarts=0, max_task_retries=0, **options)(ReplicaActor)
    config_fields = {**config._asdict(), "prefill_policy": getattr(config.prefill_policy, "value",
                                                                   config.prefill_policy)}
    actors = [remote.options(name=f"rwkv7-generate-{os.getpid()}-{i}").remote(
        args.backend, None if args.random_model else str(model_path), args.random_model, args.dtype, args.kernels,
        config_fields, tuple(fault._replace(replica=0)) if fault is not None and fault.replica == i else None)
        for i in range(n)]
    try:
        infos = ray.get([a.ready.remote() for a in actors], timeout=READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise ValueError(f"the {n} actors did not start within {READY_TIMEOUT_S:.0f} s") from None
    except ray.exceptions.RayError as e:
        raise ValueError(f"an actor could not load the model: {_cause(e)}") from None
    return RayReplicaSet(actors, [i["device"] for i in infos], config, infos[0]["vocab_size"])


def _cause(error: Exception) -> str:
    """The innermost error line of an actor's creation failure."""
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    errors = [x for x in lines if "Error:" in x or "Exception:" in x]
    return errors[-1] if errors else (lines[-1] if lines else type(error).__name__)

