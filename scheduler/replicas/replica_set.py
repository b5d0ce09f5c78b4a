"""Data-parallel replicas on one host: one engine + scheduler per device, driven as one.

``ReplicaSet`` implements the scheduler interface (``scheduler.interface.SchedulerInterface``),
so rwkv7-generate (its one writer, resume, locking and signal handling) and rwkv7-serve
drive it as they drive one scheduler.

- Threads: each replica runs its ``Scheduler.run`` in its own thread ("replica-i"); every
  callback (``on_token``, ``on_logprobs``, ``on_finish``) happens in the thread that calls
  ``ReplicaSet.run``; ``add``, ``add_group`` and ``cancel`` may come from any thread. When a run ends with nothing
  left to do (all delivered, stopped, or every replica failed) the set closes: it wakes
  its threads and joins them (``join_seconds`` in all), so none is still inside the engine
  when the process exits; one that does not end in time is reported through ``notify``.
- Routing: a new request (or a whole ``add_group`` group, which shares one prefill) goes to
  the healthy replica with the least outstanding work (prompt tokens not yet prefilled +
  tokens still to generate; ties to the one given the fewest requests), except that a
  conversation's next turn (a prompt that begins with a sequence an earlier request
  consumed, scheduler/replicas/affinity.py) goes to the replica that served that request unless it
  is much busier (``AFFINITY_SLACK_TOKENS``); ``affinity_routes`` counts those "kept" there
  and "moved" off; ``score`` runs on any healthy replica.
- Failure: a replica whose engine raises ``MAX_FAILURES`` times in a row (per engine call
  kind), or whose thread dies, is taken out; its queued and in-flight requests re-run on
  the others from their prompts. A request that failed because its engine raised re-runs
  elsewhere (at most once per replica); every id is reported exactly once. A retried
  request streams its tokens again from the first.

Fault injection (tests only): ``RWKV7_REPLICA_FAULT`` (scheduler/replicas/engine_guard.py).
"""
from __future__ import annotations

import dataclasses
import queue
import sys
import threading
import time
from typing import Any, Callable

from ..errors import FinishReason
from ..interface import SchedulerFailed
from ..stats import Stats
from .affinity import ConversationAffinity
from .replica import MAX_FAILURES, Replica, ReplicaLost, Track, max_tokens

AFFINITY_SLACK_TOKENS = 4096
"""A conversation's turn leaves its replica when that has more than twice the least loaded
replica's outstanding work plus this many tokens."""
JOIN_SECONDS = 30.0
"""How long closing a set waits for its replica threads to end, all together (the default
of ``ReplicaSet.join_seconds``)."""


class AllReplicasFailed(SchedulerFailed):
    """Every replica was taken out while requests remained (the next run does them)."""


class ReplicaSet:
    """Several schedulers driven as one (see the module docstring).

    replicas: Replica records (``build_replica_set`` makes them); engine: one replica's
    engine, for model facts such as ``vocab_size``; tokenizer: the schedulers' tokenizer.
    ``config``: the first replica's config with ``max_batch`` the set's total rows;
    ``notify(message)`` reports failures (default: stderr); ``join_seconds``: float, how
    long closing waits for the replica threads.
    """

    def __init__(self, replicas: list[Replica], engine, tokenizer=None, notify: Callable[[str], None] | None = None):
        self.replicas = replicas
        self.engine, self.tokenizer = engine, tokenizer
        config = replicas[0].scheduler.config
        self.config = config._replace(max_batch=sum(r.scheduler.config.max_batch for r in replicas))
        self.logprobs_unsupported = replicas[0].scheduler.logprobs_unsupported
        self.notify = notify or (lambda m: print(f"rwkv7-generate: {m}", file=sys.stderr, flush=True))
        self.join_seconds = JOIN_SECONDS
        self._tracks: dict[str, Track] = {}       # request id -> track
        self._internal: dict[str, Track] = {}     # scheduler-side id -> track
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.RLock()  # the tracks and routing: adds come from any thread
        self.results: dict[str, Any] = {}
        self._stopping = False
        self._closing = False
        self.affinity = ConversationAffinity()
        self.affinity_routes = {"kept": 0, "moved": 0}

    # ---- Scheduler surface -------------------------------------------------------------
    @property
    def stats(self):
        """Every replica's Stats merged (scheduler.stats.Stats.merged)."""
        return Stats.merged([r.scheduler.stats for r in self.replicas])

    def add(self, request) -> None:
        """Route a request to the healthy replica with the least outstanding work."""
        with self._lock:
            track = self._new_tracks([request])[0]
            self._route(track)

    def add_group(self, requests) -> None:
        """Route requests sharing one prompt (``Scheduler.add_group``) to one replica (as
        ``add`` routes one); a retried member re-runs alone."""
        with self._lock:
            replica = self._choose(requests[0]) if requests else self._least_loaded()
            tracks = self._new_tracks(requests)
            try:
                replica.scheduler.add_group([self._assign(t, replica) for t in tracks])
            except ValueError:
                for t in tracks:
                    self._release(t)
                    del self._tracks[t.request.id]
                raise
            replica.wake.set()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            track = self._tracks.get(request_id)
            if track is not None and track.replica is not None:
                track.replica.scheduler.cancel(track.internal_id)

    def score(self, tokens):
        """The prompt's own token logprobs (``Scheduler.score``), on the first healthy replica."""
        with self._lock:
            healthy = self._healthy()
        if not healthy:
            raise AllReplicasFailed(self._failure_summary())
        return healthy[0].scheduler.score(tokens)

    def queue_sizes(self) -> dict[str, int]:
        """Every healthy replica's ``queue_sizes`` summed."""
        sizes = [r.scheduler.queue_sizes() for r in self._healthy()]
        return {k: sum(s[k] for s in sizes) for k in ("waiting", "prefill", "ready", "running")}

    def decode_buckets(self) -> list[int]:
        """Each replica's decode bucket now, in replica order (0 for one taken out)."""
        return [0 if r.failed is not None else r.scheduler.decode_buckets()[0] for r in self.replicas]

    def precompile(self) -> None:
        """Each replica's ``Scheduler.precompile``."""
        for r in self._healthy():
            r.scheduler.precompile()

    def unstarted(self) -> list[str]:
        """Ids still waiting on a healthy replica."""
        with self._lock:
            out = []
            for r in self._healthy():
                out += [self._internal[i].request.id for i in r.scheduler.unstarted() if i in self._internal]
            return out

    def run(self, on_token: Callable[[str, int], None] | None = None,
            on_finish: Callable[[Any], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_logprobs: Callable[[str, Any], None] | None = None,
            serve_until: Callable[[], bool] | None = None) -> None:
        """Drive every replica until each added request is reported (``Scheduler.run``'s
        contract, callbacks in this thread; without ``on_finish`` the outputs collect in
        ``results``). Raises AllReplicasFailed when none is left."""
        self._stopping = self._closing = False
        callbacks = (on_token, on_logprobs, on_finish or (lambda out: self.results.__setitem__(out.id, out)))
        for r in self.replicas:
            if r.failed is None and (r.thread is None or not r.thread.is_alive()):
                r.thread = threading.Thread(target=self._serve, args=(r,), name=f"replica-{r.index}", daemon=True)
                r.wake.set()  # it may hold requests from a stopped run already
                r.thread.start()
        try:
            while True:
                if not self._stopping and should_stop is not None and should_stop():
                    self._stopping = True
                self._check_threads()
                try:
                    event = self._events.get(timeout=0.05)
                except queue.Empty:
                    if self._finished() and (serve_until is None or serve_until()):
                        return
                    continue
                self._dispatch(event, *callbacks)
        finally:
            if not self._tracks or self._stopping or not self._healthy():
                self._close()

    # ---- routing -----------------------------------------------------------------------
    def _healthy(self) -> list[Replica]:
        return [r for r in self.replicas if r.failed is None]

    def _new_tracks(self, requests) -> list[Track]:
        ids = [r.id for r in requests]
        if len(set(ids)) < len(ids) or any(i in self._tracks for i in ids):
            raise ValueError(f"duplicate request id among {ids!r}")
        tracks = [Track(r) for r in requests]
        self._tracks.update((t.request.id, t) for t in tracks)
        return tracks

    def _least_loaded(self, avoid: Replica | None = None) -> Replica:
        healthy = self._healthy()
        if not healthy:
            raise AllReplicasFailed(self._failure_summary())
        candidates = [r for r in healthy if r is not avoid] or healthy
        return min(candidates, key=lambda r: (r.work, r.routed, r.index))

    def _choose(self, request) -> Replica:
        """The replica of the conversation ``request`` continues, unless much busier than
        the least loaded one; else the least loaded; counted as routed there."""
        least = self._least_loaded()
        state = request.initial_state.key if request.initial_state is not None else None
        index = self.affinity.lookup(state, request.prompt_tokens)
        chosen = least
        if index is not None:
            preferred = self.replicas[index]
            kept = preferred.failed is None and preferred.work <= 2 * least.work + AFFINITY_SLACK_TOKENS
            chosen = preferred if kept else least
            self.affinity_routes["kept" if kept else "moved"] += 1
        chosen.routed += 1
        return chosen

    def _assign(self, track: Track, replica: Replica):
        """Account ``track`` to ``replica``; the request to add there (retries get a new id)."""
        if track.attempts:
            track.internal_id = f"{track.request.id}~retry{track.attempts}"
        track.prompt_left = len(track.request.prompt_tokens)
        track.tokens_left = int(max_tokens(track.request.params))
        track.replica, track.raised_at = replica, replica.guard.raised
        replica.work += track.work
        self._internal[track.internal_id] = track
        return track.request if track.internal_id == track.request.id \
            else dataclasses.replace(track.request, id=track.internal_id)

    def _route(self, track: Track, avoid: Replica | None = None) -> None:
        replica = self._choose(track.request) if avoid is None and not track.attempts else self._least_loaded(avoid)
        replica.scheduler.add(self._assign(track, replica))
        replica.wake.set()

    def _release(self, track: Track) -> None:
        track.replica.work -= track.work
        self._internal.pop(track.internal_id, None)

    # ---- replica threads ---------------------------------------------------------------
    def _serve(self, replica: Replica) -> None:
        """A replica's thread: run its scheduler whenever it has work, until the set closes."""
        put = self._events.put
        index = replica.index
        try:
            while True:
                replica.wake.wait()
                replica.wake.clear()
                if self._closing or replica.failed is not None:
                    return
                replica.scheduler.run(on_token=lambda rid, tok: put(("token", index, rid, tok)),
                                      on_finish=lambda out: put(("finish", index, out.id, out)),
                                      should_stop=lambda: self._stopping or replica.failed is not None,
                                      on_logprobs=lambda rid, scored: put(("logprobs", index, rid, scored)))
        except BaseException as e:  # noqa: BLE001 - a dying replica is reported, not raised
            replica.death = str(e) if isinstance(e, ReplicaLost) else f"its thread died: {type(e).__name__}: {e}"
            put(("died", index, None, None))  # the reason is replica.death

    def _check_threads(self) -> None:
        for r in self._healthy():
            if r.thread is not None and not r.thread.is_alive() and not self._closing:
                self._take_out(r, r.death or "its thread ended")  # the "died" event may be queued still

    def _close(self) -> None:
        """Wake every replica thread to end and join them; report one still alive after
        ``join_seconds`` (it may be inside the engine: exiting now could abort the process)."""
        self._closing = True
        for r in self.replicas:
            r.wake.set()
        deadline = time.monotonic() + self.join_seconds
        for r in self.replicas:
            if r.thread is None:
                continue
            r.thread.join(max(0.0, deadline - time.monotonic()))
            if r.thread.is_alive():
                self.notify(f"replica {r.index} ({r.device}): its thread did not end within "
                            f"{self.join_seconds:g} s of closing the replica set")

    # ---- events ------------------------------------------------------------------------
    def _dispatch(self, event, on_token, on_logprobs, on_finish) -> None:
        with self._lock:
            self._dispatch_locked(event, on_token, on_logprobs, on_finish)

    def _dispatch_locked(self, event, on_token, on_logprobs, on_finish) -> None:
        kind, index, internal_id, payload = event
        replica = self.replicas[index]
        if kind == "died":
            if replica.failed is None:
                self._take_out(replica, replica.death)
            return
        track = self._internal.get(internal_id)
        if track is None or track.replica is not replica or replica.failed is not None:
            return  # from a replica taken out, or a superseded attempt
        if kind == "logprobs":
            if on_logprobs is not None:
                on_logprobs(track.request.id, payload)
            return
        if kind == "token":
            if track.prompt_left:
                replica.work -= track.prompt_left
                track.prompt_left = 0
            track.tokens_left -= 1
            replica.work -= 1
            if on_token is not None:
                on_token(track.request.id, payload)
            return
        out = payload
        if out.finish_reason == FinishReason.ERROR and replica.guard.raised > track.raised_at:
            if replica.guard.worst_streak >= MAX_FAILURES:
                self._take_out(replica, f"its engine raised {replica.guard.worst_streak} times in a row "
                                        f"({out.error})")
                return
            if track.attempts < len(self.replicas):
                self._release(track)
                track.attempts += 1
                self._route(track, avoid=replica)
                return
        self._release(track)
        del self._tracks[track.request.id]
        replica.requests += 1
        replica.generated_tokens += out.generated_tokens
        if out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            state = track.request.initial_state
            self.affinity.record(state.key if state is not None else None, track.request.prompt_tokens,
                                 out.tokens, replica.index)
        if on_finish is not None:
            on_finish(out if out.id == track.request.id else dataclasses.replace(out, id=track.request.id))

    def _take_out(self, replica: Replica, reason: str) -> None:
        """Mark a replica failed and re-run its requests on the others from their prompts."""
        with self._lock:
            self._move_off(replica, reason)

    def _move_off(self, replica: Replica, reason: str) -> None:
        replica.failed = reason
        replica.wake.set()
        self.affinity.forget_replica(replica.index)
        moved = [t for t in self._tracks.values() if t.replica is replica]
        self.notify(f"replica {replica.index} ({replica.device}) taken out: {reason}; "
                    f"re-running its {len(moved)} requests on the other replicas")
        for track in moved:
            self._release(track)
            try:
                replica.scheduler.cancel(track.internal_id)
            except Exception:  # noqa: BLE001 - a broken replica's scheduler may refuse anything
                pass
        for track in moved:
            track.attempts += 1
            self._route(track)

    def _finished(self) -> bool:
        """No more results can come: all delivered, or (after a stop) only unstarted ones left."""
        with self._lock:
            return self._nothing_to_come()

    def _nothing_to_come(self) -> bool:
        if not self._tracks:
            return True
        if not self._healthy():
            raise AllReplicasFailed(self._failure_summary())
        if not self._stopping:
            return False
        waiting = set()
        for r in self._healthy():
            waiting.update(r.scheduler.unstarted())
        return all(t.internal_id in waiting for t in self._tracks.values())

    def _failure_summary(self) -> str:
        reasons = "; ".join(f"replica {r.index} ({r.device}): {r.failed}" for r in self.replicas)
        return f"every replica failed ({reasons}); {len(self._tracks)} requests not done"
