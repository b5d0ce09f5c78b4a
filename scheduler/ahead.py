"""Compiling ahead: the executables the decode batch is about to need, compiled on a thread
of their own while the current bucket decodes, so that a bucket switch finds them ready.

Only for engines that declare ``Capability.COMPILES`` (their ``compile*`` do real work and
are safe beside the steps); an engine without it gets no thread and no bookkeeping.

``Ahead`` keeps what is ready: the parts of each bucket (its executables: ``Engine.compile``;
for the MIXED policy its mixed step; once a request asked for logprobs, its scoring step)
and the resizes between pairs of buckets (``Engine.compile([a, b])`` compiles both ways).
The decode thread hands it a plan (``plan_buckets``: the buckets to have ready, most urgent
first) whenever the batch changes; the thread compiles the first plan entry not ready yet
from the current bucket, then the next, then the policy's flattened prefill shape. (It does not run
at a lower priority: XLA:CPU compiles on its own pool threads, which also run the steps, so
on a CPU the compiles ahead still take cores from decode; on a GPU they use the host's.)
The decode thread
only asks ``ready(current, bucket)``; a switch to a bucket not ready waits for its compile
(``compile_now``) only where nothing else can run (the first step). The prefill shape
compiles under the scheduler's ``prefill_lock``, between prefill calls. A background compile
that raises an Exception is logged and its bucket left to compile on use (where an error
fails that step's requests); anything else ends the thread and the run (``death``).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Sequence, cast

import numpy as np

from rwkv7_core.engine import Capability, Engine, Logprobs, MixedStep, VarlenPrefill

from .config import PrefillPolicy, bucket_for
from .prefill import Prefill
from .stats import CompileEvent, Stats

log = logging.getLogger(__name__)

PREFILL = "prefill"
"""The plan entry of the flattened prefill shape (after every bucket)."""


def neighbours(bucket: int, buckets: Sequence[int]) -> list[int]:
    """The next smaller and the next larger bucket of the ladder (those that exist)."""
    i = list(buckets).index(bucket)
    return [buckets[j] for j in (i - 1, i + 1) if 0 <= j < len(buckets)]


def shrink_path(remaining: np.ndarray, buckets: Sequence[int]) -> list[int]:
    """The buckets a batch passes through as its rows run out of tokens, soonest first.
    ``remaining``: int [live], tokens each live row may still draw (no row joins meanwhile)."""
    r = np.asarray(remaining)
    path: list[int] = []
    for left in np.unique(r).tolist():
        live = int((r > left).sum())
        if live == 0:
            break
        b = bucket_for(live, buckets)
        if not path or path[-1] != b:
            path.append(b)
    return path


def plan_buckets(current: int, now_rows: int, future_rows: int, remaining: np.ndarray, may_grow: bool,
                 buckets: Sequence[int]) -> list[int]:
    """Buckets to have ready, most urgent first (``current`` itself left out). No batch yet
    (``current`` 0): the bucket the queued requests fill (``future_rows``: short prompts are
    all prefilled by the first step, and a smaller ready bucket is not waited for), after the
    one the next step wants (``now_rows``) when that is less than half of it (long prompts:
    the batch starts small and grows as prefill goes on). A batch
    decoding: the bucket the next step wants (``now_rows``: live + ready + prefilling rows),
    the one the queued requests grow it to, ``shrink_path(remaining)`` (``remaining``: empty
    while requests wait to take freed rows), the next smaller bucket (rows ending on a stop
    token) and when ``may_grow`` (requests queued, or a server's run) the next larger one.
    Every bucket compiled is CPU time the decode steps do not get: nothing else is planned."""
    grow, want = bucket_for(max(future_rows, 1), buckets), bucket_for(max(now_rows, 1), buckets)
    if not current:
        return [grow] if grow <= 2 * want else [want, grow]
    order = [want, grow] + shrink_path(remaining, buckets)
    order += [b for b in neighbours(min(want, current), buckets) if b < min(want, current)]
    if may_grow:
        order += [b for b in neighbours(max(grow, current), buckets) if b > max(grow, current)]
    out: list[int] = []
    for b in order:
        if b != current and b not in out:
            out.append(b)
    return out


class Ahead:
    """What is compiled for the decode batch, and the thread compiling ahead (module docstring).

    ``ready(current, b)``: moving the batch from bucket ``current`` (0: none yet) to ``b``
    and stepping there waits for no compile. ``with_logprobs``: set once a request asks for
    logprobs (each bucket then also needs its scoring step). ``death``: what ended the
    thread, for the run to raise. Thread-safe."""

    def __init__(self, engine: Engine, stats: Stats, prefill: Prefill, buckets: Sequence[int],
                 prefill_lock: threading.Lock):
        self.engine, self.stats, self.prefill, self.buckets = engine, stats, prefill, tuple(buckets)
        self.prefill_lock = prefill_lock
        self.with_logprobs = False
        self.death: BaseException | None = None
        self._done: set[tuple] = set()     # ("bucket" | "mixed" | "logprobs", b), ("gather", (a, b)), (PREFILL,)
        self._failed: set[int] = set()     # buckets whose background compile raised: compiled on use
        self._plan: list[tuple[int, int] | str] = []  # (current, bucket) pairs, then PREFILL
        self._last_plan: tuple = ()
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- what is ready -------------------------------------------------------------------
    def _parts(self, current: int, b: int) -> list[tuple]:
        parts: list[tuple] = [("bucket", b)]
        if current and current != b:
            parts.append(("gather", (current, b)))
        if self.prefill.policy is PrefillPolicy.MIXED:
            parts.append(("mixed", b))
        if self.with_logprobs:
            parts.append(("logprobs", b))
        return parts

    def ready(self, current: int, b: int) -> bool:
        """Whether bucket ``b`` can be used from ``current`` without waiting for a compile (a
        bucket whose background compile failed counts as ready: it compiles on use)."""
        done = self._done
        return b in self._failed or all(part in done for part in self._parts(current, b))

    def mark_compiled(self, buckets: Sequence[int]) -> None:
        """``Engine.compile(buckets)`` returned: each bucket and the resizes between them are ready."""
        with self._cond:
            self._done.update(("bucket", b) for b in buckets)
            self._done.update(("gather", (a, b)) for a in buckets for b in buckets if a != b)

    # ---- compiling -------------------------------------------------------------------------
    def compile_now(self, current: int, b: int) -> bool:
        """Compile what moving from ``current`` to ``b`` needs, in this thread (waiting for
        what the compile thread has in progress). Returns whether anything was missing (False:
        all was ready, nothing was compiled or waited for)."""
        with self._cond:
            missing = [p for p in self._parts(current, b) if p not in self._done]
        if not missing:
            return False
        pair = [current, b] if current and current != b else [b]
        if any(kind in ("bucket", "gather") for kind, _ in missing):
            self.compile_buckets(pair)
        for kind, _ in missing:
            start = time.perf_counter()
            if kind == "mixed":
                mixed = cast(MixedStep, self.engine).compile_mixed(b, self.prefill.token_rows)
                seconds = {f"mixed:({b}, {self.prefill.token_rows})": mixed}
            elif kind == "logprobs":
                seconds = cast(Logprobs, self.engine).compile_logprobs([b])
            else:
                continue
            self._report(start, seconds)
            with self._cond:
                self._done.add((kind, b))
        return True

    def compile_buckets(self, buckets: Sequence[int]) -> None:
        """``Engine.compile(buckets)`` (reported as "bucket N" events by an engine that does not
        report its compiles), then marked ready."""
        start = time.perf_counter()
        seconds = self.engine.compile(list(buckets))
        self._report(start, {f"bucket {b}": s for b, s in seconds.items()})
        self.mark_compiled(buckets)

    def compile_prefill(self) -> None:
        """The flattened prefill shape of the VARLEN / AUTO policies (one executable, the call
        several waiting prompts share), under ``prefill_lock``: no prefill call runs meanwhile,
        so none waits (uncounted) for it. The piece lengths of serial calls, a dozen
        executables of which a job uses a few, compile when first used, in the prefill thread
        (they hold no decode step; compiled here, one long call would hold the bucket
        compiles back); MIXED's steps come with each bucket."""
        with self._cond:
            if (PREFILL,) in self._done:
                return
        if self.prefill.policy in (PrefillPolicy.VARLEN, PrefillPolicy.AUTO):
            rows = self.prefill.token_rows
            with self.prefill_lock:
                start = time.perf_counter()
                self._report(start, {f"varlen_prefill:{rows}": cast(VarlenPrefill, self.engine).compile_varlen(rows)})
        self.mark_prefill_compiled()

    def mark_prefill_compiled(self) -> None:
        """``Prefill.precompile`` returned: the prefill shape is ready."""
        with self._cond:
            self._done.add((PREFILL,))

    def _report(self, start: float, seconds: dict[str, float]) -> None:
        if Capability.REPORTS_COMPILES not in self.engine.capabilities:  # else its listener reported them
            for what, s in seconds.items():
                if s > 0:
                    self.stats.record_compile(CompileEvent(start, what, s))

    # ---- the plan and the thread -----------------------------------------------------------
    def want(self, current: int, buckets: list[int], prompts_wait: bool) -> None:
        """Compile next: ``buckets`` (most urgent first) from ``current``, then, while
        ``prompts_wait`` (requests still to prefill), the prefill shape; replaces the plan
        not started yet (a no-op when it is unchanged)."""
        key = (current, tuple(buckets), prompts_wait, self.with_logprobs)
        if key == self._last_plan:
            return
        self._last_plan = key
        with self._cond:
            self._plan = [(current, b) for b in buckets if b not in self._failed]
            if prompts_wait:
                self._plan.append(PREFILL)
            self._cond.notify_all()

    def start(self) -> None:
        """Start the compile thread (once per run)."""
        self._stop, self.death, self._last_plan = False, None, ()
        self._thread = threading.Thread(target=self._work, name="compile-ahead", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread: it finishes the compile in progress (one cannot be cut short)."""
        with self._cond:
            self._stop = True
            self._plan = []
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _next(self) -> tuple[int, int] | str | None:
        """The next plan entry with something to compile; None when stopping."""
        with self._cond:
            while True:
                if self._stop:
                    return None
                while self._plan:
                    job = self._plan.pop(0)
                    if isinstance(job, tuple):
                        if not self.ready(*job):
                            return job
                    elif (PREFILL,) not in self._done:
                        return job
                self._cond.wait()

    def _work(self) -> None:
        self.stats.set_role("ahead")
        try:
            while (job := self._next()) is not None:
                self._run(job)
        except BaseException as e:  # noqa: BLE001 - handed to the run thread
            self.death = e

    def _run(self, job: tuple[int, int] | str) -> None:
        """One plan entry; an Exception is logged and its bucket compiles on use instead."""
        try:
            if isinstance(job, tuple):
                self.compile_now(*job)
            else:
                self.compile_prefill()
        except Exception as e:
            self.stats.record_ahead_failure()
            log.warning("compiling ahead %s failed (it compiles when used instead): %s: %s",
                        f"bucket {job[1]}" if isinstance(job, tuple) else "the prefill shape", type(e).__name__, e)
            with self._cond:
                if isinstance(job, tuple):
                    self._failed.add(job[1])
                else:
                    self._done.add((PREFILL,))
