"""The scheduler's step loop: the threads that drive the engine, moving requests through
the books (scheduler/books.py), the slot table (scheduler/slots.py) and the prefill
(scheduler/prefill.py) that ``Scheduler`` (scheduler/core.py) owns.

Threads: ``run()`` drives decode steps in the calling thread; one prefill worker takes
WAITING requests in arrival order, prefills them under ``prefill_lock`` (one prompt per
call for SERIAL, flattened pieces for VARLEN; using the prefix cache), draws each first
token and hands the request over as READY.
Every loop iteration of ``run()``: report final requests, apply cancels, admit READY
requests (at most ``max_batch`` live rows, and no more than the largest bucket ready),
resize the batch to the smallest bucket holding the live rows plus the prompts in prefill
(which join soon: no shrink-then-grow) if that differs from the current one (compacting
live slots to the front), insert the admitted rows into free slots, run one engine step,
and account the drawn tokens. MIXED has no worker and runs prompt chunks inside the decode
step.

Compiles: an engine with ``Capability.COMPILES`` gets a third thread (scheduler/ahead.py)
that compiles the buckets the batch is about to need while it decodes; a step whose bucket
is still compiling keeps a ready one (``config.choose_bucket``: padded rows when shrinking,
ready rows waiting when growing; ``Stats.kept_steps`` counts them), so the decode thread
waits for a compile only when nothing decodes yet. Other engines compile nothing, and get
neither the thread nor the bookkeeping.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, cast

import numpy as np

from rwkv7_core.engine import Capability, Engine, Logprobs
from rwkv7_core.sampling import NONFINITE_TOKEN, TokenLogprobs
from rwkv7_core.token_mask import all_allowed

from .ahead import Ahead, plan_buckets
from .books import Books, Entry
from .config import PrefillPolicy, SchedulerConfig, bucket_for, choose_bucket
from .errors import ErrorCode, FinishReason
from .finishing import Finisher, RunCallbacks
from .grammar import fill_masks
from .interface import SchedulerFailed
from .prefill import PiecesFailed, Prefill
from .prefill_feed import PrefillFeed
from .request import RequestOutput, RequestState
from .slots import SlotTable, each
from .stats import BucketSwitch, CompileEvent, Stats


class StepLoop:
    """Runs a scheduler's requests on ``engine``: ``run`` (the decode loop in the calling
    thread, a prefill worker beside it) and ``precompile``; it owns the decode batch's
    ``SlotTable``. The books, prefill, stats, ``results`` dict and ``prefill_lock`` are the
    scheduler's, shared; the prefill side is a ``PrefillFeed`` (scheduler/prefill_feed.py), the
    end of each request a ``Finisher`` (scheduler/finishing.py)."""

    def __init__(self, engine: Engine, config: SchedulerConfig, tokenizer, stats: Stats, books: Books,
                 prefill: Prefill, results: dict[str, RequestOutput], prefill_lock: threading.Lock):
        self.engine, self.config, self.tokenizer, self.stats = engine, config, tokenizer, stats
        self.results, self.prefill_lock = results, prefill_lock
        self._books, self._slots, self._prefill = books, SlotTable(), prefill
        self._policy = PrefillPolicy(config.prefill_policy)  # validated: a member already
        self._feed = PrefillFeed(engine, config.max_batch, stats, books, prefill, prefill_lock)
        self._end = Finisher(engine, tokenizer, stats, books, self._slots, prefill, results, prefill_lock)
        self._compiled: set[int] = set()  # buckets compiled, by an engine without Capability.COMPILES
        self._ahead = (Ahead(engine, stats, prefill, config.buckets, prefill_lock)
                       if Capability.COMPILES in engine.capabilities else None)
        self._plan_key: tuple = ()
        self._serving = False  # run(serve_until=...): requests may come any time
        self._prefill_compiled = False

    def precompile(self) -> None:
        """Compile every executable a run can call: every bucket (and the resizes between
        them), the prefill shapes of the policy and, for an engine with Capability.LOGPROBS,
        the scoring paths (once; ``run`` does it first when ``config.precompile``). Its
        compiles are booked to "precompile"."""
        role = self.stats.role()
        self.stats.set_role("precompile")
        try:
            self._precompile()
        finally:
            self.stats.set_role(role)

    def _precompile(self) -> None:
        if self._ahead is not None:
            self._ahead.compile_buckets(self.config.buckets)
        else:
            self._ensure_compiled(self.config.buckets)
        if self._prefill_compiled:
            return
        start = time.perf_counter()
        seconds = self._prefill.precompile(self.config.buckets)
        if Capability.LOGPROBS in self.engine.capabilities:
            seconds.update(cast(Logprobs, self.engine).compile_logprobs(self.config.buckets))
        if Capability.REPORTS_COMPILES not in self.engine.capabilities:
            for what, s in seconds.items():
                self.stats.record_compile(CompileEvent(start, what, s))
        if self._ahead is not None:
            self._ahead.mark_prefill_compiled()
        self._prefill_compiled = True

    def run(self, on_token: Callable[[str, int], None] | None = None,
            on_finish: Callable[[RequestOutput], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_logprobs: Callable[[str, TokenLogprobs], None] | None = None,
            serve_until: Callable[[], bool] | None = None) -> None:
        """``Scheduler.run`` (scheduler/core.py documents it)."""
        self._end.calls = RunCallbacks(on_token, on_finish, on_logprobs)
        self._serving, self._plan_key = serve_until is not None, ()
        self._feed.admitting = True
        self._feed.stop = False
        self._feed.death = None
        if self.config.precompile:
            self.precompile()
        self.stats.set_role("decode")
        books = self._books
        worker = threading.Thread(target=None if self._policy is PrefillPolicy.MIXED else self._feed.worker,
                                  name="prefill", daemon=True)
        worker.start()
        if self._ahead is not None:
            self._ahead.start()
        try:
            while True:
                if self._feed.admitting and should_stop is not None and should_stop():
                    with books.cond:
                        self._feed.admitting = False
                self._check_threads()
                self._end.report_finals()
                self._apply_cancels()
                if self._ahead is not None:
                    self._plan_ahead(self._ahead)
                admitted = self._take_ready()
                if self._policy is PrefillPolicy.MIXED:
                    self._feed.start_pieces()
                if not self._slots.holders and not admitted and not self._mixed_work():
                    with books.cond:
                        if self._idle() and (serve_until is None or serve_until()):
                            break
                        books.cond.wait_for(lambda: books.ready or books.finals or books.cancels, timeout=0.05)
                    continue
                self._decode_step(admitted)
        finally:
            with books.cond:
                self._feed.stop = True
                books.cond.notify_all()
            worker.join()
            self._end.report_finals()
            if self._ahead is not None:
                self._ahead.stop()

    def _check_threads(self) -> None:
        """SchedulerFailed when the prefill or the compile thread died."""
        if self._feed.death is not None:
            death = self._feed.death
            raise SchedulerFailed(f"the prefill thread died: {type(death).__name__}: {death}") from death
        if self._ahead is not None and self._ahead.death is not None:
            death = self._ahead.death
            raise SchedulerFailed(f"the compile-ahead thread died: {type(death).__name__}: {death}") from death

    # ---- run-thread bookkeeping -------------------------------------------------------
    def _mixed_work(self) -> bool:
        return self._policy is PrefillPolicy.MIXED and len(self._prefill) > 0

    def _idle(self) -> bool:
        """Nothing left to do in this run (caller holds the books' cond)."""
        books = self._books
        return (not books.ready and not books.finals and not books.prefilling and not self._slots.holders
                and not (self._feed.admitting and books.waiting))

    def _apply_cancels(self) -> None:
        if not self._books.cancels:
            return
        for entry in self._books.take_cancels():
            if entry.state is RequestState.RUNNING:
                self._end.finish(entry, FinishReason.CANCELLED)
            else:
                entry.cancel_requested = True  # finished when it comes out of prefill

    def _take_ready(self) -> list[Entry]:
        """READY entries that fit in max_batch and in the largest bucket ready, first tokens
        accounted (those that ended on it, or were cancelled meanwhile, made final)."""
        books = self._books
        admitted: list[Entry] = []
        room = self._capacity() - len(self._slots)
        while len(admitted) < room:
            with books.cond:
                if not books.ready:
                    break
                entry = books.ready[0]
            if entry.cancel_requested:
                self._end.finish(entry, FinishReason.CANCELLED)
            elif not self._end.ended_on_first(entry):
                books.move(entry, RequestState.RUNNING)
                admitted.append(entry)
        return admitted

    def _masks(self) -> Callable[[], np.ndarray] | None:
        """This step's mask function (rwkv7_core/token_mask.Masks: the engine calls it while
        the step's forward runs): int32 [bucket, W] packed allowed-token masks, rows without a
        grammar allowing everything; None when no live row has one (the unmasked step runs)."""
        slots = self._slots
        if not slots.constrained.any():  # only live rows are
            return None
        rows = [(r, slots.matchers[r]) for r in np.flatnonzero(slots.constrained).tolist()]
        bucket, vocab_size = slots.bucket, self.engine.vocab_size

        def masks() -> np.ndarray:
            start = time.perf_counter()
            allowed = all_allowed(bucket, vocab_size)
            fill_masks(rows, allowed)
            self.stats.record_masks(len(rows), time.perf_counter() - start)
            return allowed
        return masks

    # ---- batch ------------------------------------------------------------------------
    def _ensure_compiled(self, buckets) -> bool:
        """An engine without Capability.COMPILES: ``compile`` each new bucket (it does nothing).
        Returns whether there was one."""
        todo = [b for b in buckets if b not in self._compiled]
        if not todo:
            return False
        start = time.perf_counter()
        seconds = self.engine.compile(todo)
        if Capability.REPORTS_COMPILES not in self.engine.capabilities:  # else its listener reported them
            for b in todo:
                self.stats.record_compile(CompileEvent(start, f"bucket {b}", seconds[b]))
        self._compiled.update(todo)
        return True

    def _ready(self, bucket: int) -> bool:
        """Moving the batch to ``bucket`` waits for no compile."""
        return self._ahead is None or self._ahead.ready(self._slots.bucket, bucket)

    def _capacity(self) -> int:
        """Most live rows the next step may hold: max_batch, or with a batch already decoding
        and buckets still compiling, the largest bucket ready (the rest wait for the next)."""
        current = self._slots.bucket
        if self._ahead is None or not current:
            return self.config.max_batch
        return min(self.config.max_batch, max(b for b in self.config.buckets if b == current or self._ready(b)))

    def _plan_ahead(self, ahead: Ahead) -> None:
        """Hand the compile thread the buckets to have ready (``ahead.plan_buckets``) when the
        batch or its queues changed since the last plan."""
        books, slots, max_batch = self._books, self._slots, self.config.max_batch
        live, ready, prefilling, waiting = len(slots), len(books.ready), books.prefilling, len(books.waiting)
        if slots.any_wants_logprobs() and not ahead.with_logprobs:
            ahead.with_logprobs = True
        key = (slots.bucket, live, ready, prefilling, min(waiting, max_batch), ahead.with_logprobs)
        if key == self._plan_key:
            return
        self._plan_key = key
        queued = ready + prefilling + (waiting if self._feed.admitting else 0)
        remaining = slots.remaining[slots.live] if not queued else slots.remaining[:0]
        plan = plan_buckets(slots.bucket, min(live + ready + prefilling, max_batch), min(live + queued, max_batch),
                            remaining, bool(queued) or self._serving, self.config.buckets)
        ahead.want(slots.bucket, plan, prompts_wait=bool(waiting) and self._feed.admitting)

    def _decode_step(self, admitted: list[Entry]) -> None:
        engine, slots = self.engine, self._slots
        with self._books.cond:  # a prompt in prefill, or one ready but held back, joins soon: keep room for it
            joining = self._books.prefilling + len(self._books.ready)
        need = len(slots) + len(admitted)
        want = min(need + joining, self.config.max_batch)
        target = choose_bucket(need, want, slots.bucket, self.config.buckets, self._ready)
        wanted = bucket_for(want, self.config.buckets)
        report = None
        try:
            if target != slots.bucket:
                self._resize(target)
            free = iter(slots.free_slots() if admitted else ())
            for entry in admitted:
                slot = next(free)
                engine.insert(slot, entry.row, entry.params)
                entry.row = None
                slots.place(entry, slot, entry.first_token)
            allowed = self._masks()
            masks = {} if allowed is None else {"allowed": allowed}
            clock = self.stats.start_call()
            scored = None
            if self._mixed_work():
                out, report = self._prefill.mixed_step(slots.tokens, slots.positions, **masks)
                out = np.asarray(out)
            elif slots.any_wants_logprobs():
                out, scored = cast(Logprobs, engine).step_logprobs(slots.tokens, slots.positions, **masks)
            else:
                out = np.asarray(engine.step(slots.tokens, slots.positions, **masks))
            seconds = self.stats.call_seconds(clock)
        except PiecesFailed as e:
            self._feed.hand_over(e.report)
            self._fail_batch(admitted, e.__cause__)
            return
        except Exception as e:  # fail this step's requests; the scheduler stays usable
            self._fail_batch(admitted, e)
            return
        if report is not None:
            self._feed.hand_over(report)
        self.stats.record_step(clock[1], target, len(slots), engine.last_path, seconds,
                               wanted if wanted != target else 0)
        self._account(out, scored)

    def _resize(self, target: int) -> None:
        """Move the batch to bucket ``target`` (compiled first if it is not yet: the decode
        thread waits, ``BucketSwitch.compile_wait``), live rows compacted to the front."""
        start, own = time.perf_counter(), self.stats.compiled_in_this_thread()
        if self._ahead is None:
            compiled = self._ensure_compiled([target])
        else:
            compiled = self._ahead.compile_now(self._slots.bucket, target)
        waited = time.perf_counter() - start if compiled else 0.0  # a ready switch waited for nothing
        if compiled and self._ahead is not None:
            self.stats.record_blocked(max(0.0, waited - (self.stats.compiled_in_this_thread() - own)))
        keep = self._slots.live_slots()
        clock = self.stats.start_call()
        self.engine.resize(keep, target)
        seconds = self.stats.call_seconds(clock)
        self.stats.record_switch(BucketSwitch(clock[1], self._slots.bucket, target, len(keep), seconds, waited))
        self._slots.resize(target, keep)

    def _fail_batch(self, admitted: list[Entry], error: BaseException) -> None:
        """Every live and admitted request fails with ``error``; the next step starts a fresh batch."""
        message = f"engine step failed: {type(error).__name__}: {error}"
        failing = {**{e.id: e for e in admitted if not e.state.is_final}, **self._slots.holders}  # each once
        for entry in failing.values():
            entry.fail(ErrorCode.ENGINE_FAILED, message)
            self._end.finish(entry, FinishReason.ERROR)
        self._slots.resize(0, [])

    def _account(self, out: np.ndarray, scored: TokenLogprobs | None = None) -> None:
        """Consume one step's drawn tokens [bucket] (and their scores, when some row asked)."""
        slots = self._slots
        live = slots.live
        drawn = slots.advance(out, NONFINITE_TOKEN, time.perf_counter())
        self.stats.inter_token.add_many(drawn.gaps)
        entries, emit = slots.entries, drawn.emit
        if scored is not None and self._end.calls.on_logprobs is not None:
            for slot in np.flatnonzero(emit & slots.wants_logprobs).tolist():
                self._end.calls.on_logprobs(entries[slot].id, scored.row(slot))
        if self._end.calls.on_token is not None:
            each(self._end.calls.on_token, slots.ids[emit], out[emit].tolist())
        ended = live & (drawn.nonfinite | drawn.stop_hit | (slots.remaining <= 0))
        stopped, broken = drawn.stop_hit, None
        if slots.has_stop_str.any() or slots.constrained.any():
            stopped, broken = stopped.copy(), np.zeros_like(live)
            for slot in np.flatnonzero(emit & slots.has_stop_str).tolist():
                stopped[slot] = self._end.stop_string_hit(entries[slot], int(out[slot]))
            for slot in np.flatnonzero(emit & slots.constrained).tolist():
                grammar = self._end.grammar_advance(entries[slot], int(out[slot]))
                stopped[slot] |= grammar == "stop"
                broken[slot] = grammar == "error"
            ended |= live & (stopped | broken)
        for slot in np.flatnonzero(ended).tolist():
            entry = entries[slot]
            if drawn.nonfinite[slot] or (broken is not None and broken[slot]):
                if entry.error is None:  # else the grammar broke
                    entry.fail(ErrorCode.NONFINITE_LOGITS, "non-finite logits")
                self._end.finish(entry, FinishReason.ERROR)
            else:
                if drawn.stop_hit[slot]:
                    entry.stop_token = int(out[slot])
                    if scored is not None and slots.wants_logprobs[slot]:
                        entry.stop_logprobs = scored.row(slot)
                self._end.finish(entry, FinishReason.STOP if stopped[slot] else FinishReason.LENGTH)
