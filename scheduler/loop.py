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

import logging
import threading
import time
from typing import Callable

import numpy as np

from rwkv7_core.engine import Capability, Engine
from rwkv7_core.sampling import NONFINITE_TOKEN, TokenLogprobs
from rwkv7_core.stop_strings import StopMatcher
from rwkv7_core.token_mask import all_allowed

from .ahead import Ahead, plan_buckets
from .books import Books, Entry
from .config import PrefillPolicy, SchedulerConfig, bucket_for, choose_bucket
from .errors import ErrorCode, FinishReason
from .grammar import fill_masks
from .interface import SchedulerFailed
from .prefill import PiecesFailed, Prefill, PrefillReport, draw_first
from .request import RequestOutput, RequestState
from .slots import SlotTable, each
from .stats import BucketSwitch, CompileEvent, RequestRecord, Stats

log = logging.getLogger(__name__)


class StepLoop:
    """Runs a scheduler's requests on ``engine``: ``run`` (the decode loop in the calling
    thread, a prefill worker beside it) and ``precompile``; it owns the decode batch's
    ``SlotTable``. The books, prefill, stats, ``results`` dict and ``prefill_lock`` are the
    scheduler's, shared."""

    def __init__(self, engine: Engine, config: SchedulerConfig, tokenizer, stats: Stats, books: Books,
                 prefill: Prefill, results: dict[str, RequestOutput], prefill_lock: threading.Lock):
        self.engine, self.config, self.tokenizer, self.stats = engine, config, tokenizer, stats
        self.results, self.prefill_lock = results, prefill_lock
        self._books, self._slots, self._prefill = books, SlotTable(), prefill
        self._policy = config.prefill_policy
        self._admitting = True
        self._stop_worker = False
        self._worker_death: BaseException | None = None  # what ended the prefill thread
        self._compiled: set[int] = set()  # buckets compiled, by an engine without Capability.COMPILES
        self._ahead = (Ahead(engine, stats, prefill, config.buckets, prefill_lock)
                       if Capability.COMPILES in engine.capabilities else None)
        self._plan_key: tuple = ()
        self._serving = False  # run(serve_until=...): requests may come any time
        self._prefill_compiled = False
        self._on_token: Callable[[str, int], None] | None = None
        self._on_finish: Callable[[RequestOutput], None] | None = None
        self._on_logprobs: Callable[[str, TokenLogprobs], None] | None = None

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
            seconds.update(self.engine.compile_logprobs(self.config.buckets))
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
        self._on_token, self._on_finish, self._on_logprobs = on_token, on_finish, on_logprobs
        self._serving, self._plan_key = serve_until is not None, ()
        self._admitting = True
        self._stop_worker = False
        self._worker_death = None
        if self.config.precompile:
            self.precompile()
        self.stats.set_role("decode")
        books = self._books
        worker = threading.Thread(target=None if self._policy is PrefillPolicy.MIXED else self._prefill_worker,
                                  name="prefill", daemon=True)
        worker.start()
        if self._ahead is not None:
            self._ahead.start()
        try:
            while True:
                if self._admitting and should_stop is not None and should_stop():
                    with books.cond:
                        self._admitting = False
                self._check_threads()
                self._report_finals()
                self._apply_cancels()
                if self._ahead is not None:
                    self._plan_ahead(self._ahead)
                admitted = self._take_ready()
                if self._policy is PrefillPolicy.MIXED:
                    self._start_pieces()
                if not self._slots.holders and not admitted and not self._mixed_work():
                    with books.cond:
                        if self._idle() and (serve_until is None or serve_until()):
                            break
                        books.cond.wait_for(lambda: books.ready or books.finals or books.cancels, timeout=0.05)
                    continue
                self._decode_step(admitted)
        finally:
            with books.cond:
                self._stop_worker = True
                books.cond.notify_all()
            worker.join()
            self._report_finals()
            if self._ahead is not None:
                self._ahead.stop()

    def _check_threads(self) -> None:
        """SchedulerFailed when the prefill or the compile thread died."""
        if self._worker_death is not None:
            death = self._worker_death
            raise SchedulerFailed(f"the prefill thread died: {type(death).__name__}: {death}") from death
        if self._ahead is not None and self._ahead.death is not None:
            death = self._ahead.death
            raise SchedulerFailed(f"the compile-ahead thread died: {type(death).__name__}: {death}") from death

    # ---- prefill (scheduler/prefill.py) ----------------------------------------------
    def _can_start(self) -> bool:
        """A waiting request may start prefill: admissions are open and the batch has room
        for it beside the live, ready and prefilling ones (caller holds the books' cond)."""
        books = self._books
        return bool(self._admitting and books.waiting and books.running + len(books.ready)
                    + books.prefilling < self.config.max_batch)

    def _prefill_worker(self) -> None:
        """SERIAL / VARLEN / AUTO: prefill calls beside decode, until the run ends; an
        exception that escapes ends the run too (``run`` raises it)."""
        self.stats.set_role("prefill")
        try:
            self._prefill_calls()
        except BaseException as e:  # noqa: BLE001 - handed to the run thread
            self._worker_death = e

    def _prefill_calls(self) -> None:
        books = self._books
        while True:
            with books.cond:
                books.cond.wait_for(lambda: self._stop_worker or self._prefill or self._can_start(), timeout=0.05)
                if self._stop_worker:
                    return
            self._start_pieces()
            if self._prefill:
                with self.prefill_lock:
                    report = self._prefill.run()
                self._hand_over(report)

    def _mixed_work(self) -> bool:
        return self._policy is PrefillPolicy.MIXED and len(self._prefill) > 0

    def _start_pieces(self) -> None:
        """Move waiting requests into the prefill queue while it wants more; once admissions
        stop, prompts still in prefill go back to waiting (unstarted: a later run redoes them)."""
        books = self._books
        with books.cond:
            if not self._admitting:
                for entry in self._prefill.abandon():
                    books.move(entry, RequestState.WAITING)
            while self._prefill.wants_more() and self._can_start():
                entry = books.waiting[0]
                books.move(entry, RequestState.PREFILL)
                failed = self._prefill.add(entry)
                if failed is not None:
                    self._hand_over(PrefillReport([failed], None, [], 0, 0))

    def _hand_over(self, report: PrefillReport) -> None:
        """Apply what a prefill call produced: its stats; each finished prompt (and its
        group's forks) READY, each failed one final."""
        for record in report.pieces:
            self.stats.record_prefill(record)
        if report.call is not None:
            self.stats.record_prefill_call(report.call)
        self.stats.record_prefix_lookups(report.hits, report.misses, report.removed, report.hit_tokens)
        for done in report.done:
            entry = done.entry
            entry.row, entry.first_token, entry.first_token_time = done.row, done.first_token, done.first_token_time
            entry.cached_tokens, entry.prefill_seconds = done.cached_tokens, done.prefill_seconds
            if done.error is not None:
                entry.fail(ErrorCode.PREFILL_FAILED, done.error)
            for member in [entry, *self._forked(entry)]:
                if member.error is None:
                    self._books.move(member, RequestState.READY)
                else:
                    self._books.finish(member, FinishReason.ERROR)

    def _forked(self, entry: Entry) -> list[Entry]:
        """The forks of a prefilled entry, each holding the shared row (engines copy a row on
        insert, never alias it) and the first token drawn with its own params."""
        forks, entry.forks = entry.forks, []
        for fork in forks:
            fork.cached_tokens, fork.prefill_seconds = entry.cached_tokens, entry.prefill_seconds
            fork.error, fork.error_code = entry.error, entry.error_code
            if entry.error is None:
                fork.row = entry.row
                fork.first_token = draw_first(self.engine, entry.row, fork)
                fork.first_token_time = time.perf_counter()
        return forks

    # ---- run-thread bookkeeping -------------------------------------------------------
    def _idle(self) -> bool:
        """Nothing left to do in this run (caller holds the books' cond)."""
        books = self._books
        return (not books.ready and not books.finals and not books.prefilling and not self._slots.holders
                and not (self._admitting and books.waiting))

    def _apply_cancels(self) -> None:
        if not self._books.cancels:
            return
        for entry in self._books.take_cancels():
            if entry.state is RequestState.RUNNING:
                self._finish(entry, FinishReason.CANCELLED)
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
                self._finish(entry, FinishReason.CANCELLED)
            elif not self._ended_on_first(entry):
                books.move(entry, RequestState.RUNNING)
                admitted.append(entry)
        return admitted

    def _ended_on_first(self, entry: Entry) -> bool:
        """Account the first token; True (and the entry final) if the request ended."""
        token = entry.first_token
        if token == NONFINITE_TOKEN:
            entry.fail(ErrorCode.NONFINITE_LOGITS, "non-finite logits")
            self._finish(entry, FinishReason.ERROR)
        elif entry.params.max_tokens == 0:  # prefilled only for its final state
            self._finish(entry, FinishReason.LENGTH)
        elif token in entry.params.stop_tokens:
            entry.stop_token = token
            if entry.params.logprobs is not None:
                entry.stop_logprobs = self.engine.row_logprobs(entry.row, token)
            self._finish(entry, FinishReason.STOP)
        else:
            self._emit_first(entry, token)
            grammar = self._grammar_advance(entry, token)
            if grammar is not None:
                self._finish(entry, grammar)
            elif len(entry.tokens) >= entry.params.max_tokens:
                self._finish(entry, FinishReason.LENGTH)
            elif entry.params.stop and self._stop_string_hit(entry, token):
                self._finish(entry, FinishReason.STOP)
            else:
                return False
        return True

    def _emit_first(self, entry: Entry, token: int) -> None:
        """The first token (drawn after prefill, scored on the row's logits if asked)."""
        entry.tokens.append(token)
        entry.last_emit = time.perf_counter()
        if entry.params.logprobs is not None and self._on_logprobs is not None:
            self._on_logprobs(entry.id, self.engine.row_logprobs(entry.row, token))
        if self._on_token is not None:
            self._on_token(entry.id, token)

    def _grammar_advance(self, entry: Entry, token: int) -> FinishReason | None:
        """Feed an emitted token to the entry's grammar matcher (if any): STOP when the
        grammar is complete, ERROR (``entry.error`` set) when the token broke it, else None."""
        matcher = entry.matcher
        if matcher is None:
            return None
        matcher.consume(token)
        if matcher.error is not None:
            entry.fail(ErrorCode.GRAMMAR_BROKEN, f"grammar: {matcher.error}")
            return FinishReason.ERROR
        return FinishReason.STOP if matcher.done else None

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

    def _stop_string_hit(self, entry: Entry, token: int) -> bool:
        """True when ``token``, the newest, completes a stop string (called once per token;
        the matcher reads each token's bytes once: rwkv7_core/stop_strings.py)."""
        if entry.stop_matcher is None:
            entry.stop_matcher = StopMatcher(entry.params.stop)
        return entry.stop_matcher.feed_bytes(self.tokenizer.decode_bytes([token]))[1] >= 0

    def _finish(self, entry: Entry, reason: FinishReason) -> None:
        """Make a READY or RUNNING request final (``entry.stop_token`` set: it ended on a stop
        token, which the state has not consumed and never will); its row and slot are freed."""
        if entry.slot >= 0:
            self._slots.settle(entry)
        if entry.request.return_state and reason in (FinishReason.LENGTH, FinishReason.STOP):
            try:
                entry.final_state = self._final_state(entry, pending=bool(entry.tokens) and entry.stop_token is None)
            except Exception as e:
                entry.fail(ErrorCode.FINAL_STATE_FAILED, f"reading the final state failed: {type(e).__name__}: {e}")
                reason = FinishReason.ERROR
        if reason in (FinishReason.LENGTH, FinishReason.STOP) and entry.slot >= 0 and self._prefill.keeps_turns:
            self._keep_turn_state(entry)
        if entry.slot >= 0:
            self._slots.remove(entry)
        entry.row = None
        self._books.finish(entry, reason)

    def _keep_turn_state(self, entry: Entry) -> None:
        """Cache the slot's state under the prompt plus the tokens it consumed: every emitted
        token but the last, which was drawn and not fed, unless a stop token (never fed) ended
        the request. A failure to read it is only a missed cache entry."""
        consumed = entry.tokens if entry.stop_token is not None else entry.tokens[:-1]
        if not consumed:  # the prompt's own state: prefill cached it
            return
        try:
            self._prefill.keep_final(entry, consumed, self.engine.to_host(self.engine.extract(entry.slot)))
        except Exception as e:  # noqa: BLE001 - the request itself is done and fine
            log.warning("turn cache: could not keep %s's final state: %s: %s", entry.id, type(e).__name__, e)
            return
        self.stats.record_turn_state()

    def _final_state(self, entry: Entry, pending: bool):
        """Host row after the prompt and every emitted token: the slot's (or, before the batch,
        the prefill row's) state, run through the last emitted token when it is ``pending``
        (drawn but not yet fed: every finish but a stop token's)."""
        row = self.engine.extract(entry.slot) if entry.slot >= 0 else entry.row
        if pending:
            with self.prefill_lock:
                row = self.engine.prefill(np.array(entry.tokens[-1:], np.int32), row)
        return self.engine.to_host(row)

    def _report_finals(self) -> None:
        """Hand every final request's output over (``on_finish`` or ``results``) and forget it."""
        for entry in self._books.take_finals():
            out = entry.output()
            self.stats.record_request(RequestRecord(
                entry.id, out.prompt_tokens, entry.cached_tokens, entry.prefill_seconds, out.ttft,
                out.generated_tokens, out.finish_reason, out.arrival_time, out.finish_time))
            self._books.forget(entry)
            if self._on_finish is not None:
                self._on_finish(out)
            else:
                self.results[entry.id] = out

    # ---- batch ------------------------------------------------------------------------
    def _ensure_compiled(self, buckets) -> None:
        """An engine without Capability.COMPILES: ``compile`` each new bucket (it does nothing)."""
        todo = [b for b in buckets if b not in self._compiled]
        if not todo:
            return
        start = time.perf_counter()
        seconds = self.engine.compile(todo)
        if Capability.REPORTS_COMPILES not in self.engine.capabilities:  # else its listener reported them
            for b in todo:
                self.stats.record_compile(CompileEvent(start, f"bucket {b}", seconds[b]))
        self._compiled.update(todo)

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
        queued = ready + prefilling + (waiting if self._admitting else 0)
        remaining = slots.remaining[slots.live] if not queued else slots.remaining[:0]
        plan = plan_buckets(slots.bucket, min(live + ready + prefilling, max_batch), min(live + queued, max_batch),
                            remaining, bool(queued) or self._serving, self.config.buckets)
        ahead.want(slots.bucket, plan, prompts_wait=bool(waiting) and self._admitting)

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
                out, scored = engine.step_logprobs(slots.tokens, slots.positions, **masks)
            else:
                out = np.asarray(engine.step(slots.tokens, slots.positions, **masks))
            seconds = self.stats.call_seconds(clock)
        except PiecesFailed as e:
            self._hand_over(e.report)
            self._fail_batch(admitted, e.__cause__)
            return
        except Exception as e:  # fail this step's requests; the scheduler stays usable
            self._fail_batch(admitted, e)
            return
        if report is not None:
            self._hand_over(report)
        self.stats.record_step(clock[1], target, len(slots), engine.last_path, seconds,
                               wanted if wanted != target else 0)
        self._account(out, scored)

    def _resize(self, target: int) -> None:
        """Move the batch to bucket ``target`` (compiled first if it is not yet: the decode
        thread waits, ``BucketSwitch.compile_wait``), live rows compacted to the front."""
        start, own = time.perf_counter(), self.stats.compiled_in_this_thread()
        if self._ahead is None:
            self._ensure_compiled([target])
        else:
            self._ahead.compile_now(self._slots.bucket, target)
            self.stats.record_blocked(max(0.0, time.perf_counter() - start
                                          - (self.stats.compiled_in_this_thread() - own)))
        keep = self._slots.live_slots()
        clock = self.stats.start_call()
        self.engine.resize(keep, target)
        seconds = self.stats.call_seconds(clock)
        self.stats.record_switch(BucketSwitch(clock[1], self._slots.bucket, target, len(keep), seconds,
                                              time.perf_counter() - start - seconds))
        self._slots.resize(target, keep)

    def _fail_batch(self, admitted: list[Entry], error: BaseException) -> None:
        """Every live and admitted request fails with ``error``; the next step starts a fresh batch."""
        message = f"engine step failed: {type(error).__name__}: {error}"
        failing = {**{e.id: e for e in admitted if not e.state.is_final}, **self._slots.holders}  # each once
        for entry in failing.values():
            entry.fail(ErrorCode.ENGINE_FAILED, message)
            self._finish(entry, FinishReason.ERROR)
        self._slots.resize(0, [])

    def _account(self, out: np.ndarray, scored: TokenLogprobs | None = None) -> None:
        """Consume one step's drawn tokens [bucket] (and their scores, when some row asked)."""
        slots = self._slots
        live = slots.live
        drawn = slots.advance(out, NONFINITE_TOKEN, time.perf_counter())
        self.stats.inter_token.add_many(drawn.gaps)
        entries, emit = slots.entries, drawn.emit
        if scored is not None and self._on_logprobs is not None:
            for slot in np.flatnonzero(emit & slots.wants_logprobs).tolist():
                self._on_logprobs(entries[slot].id, scored.row(slot))
        if self._on_token is not None:
            each(self._on_token, slots.ids[emit], out[emit].tolist())
        ended = live & (drawn.nonfinite | drawn.stop_hit | (slots.remaining <= 0))
        stopped, broken = drawn.stop_hit, None
        if slots.has_stop_str.any() or slots.constrained.any():
            stopped, broken = stopped.copy(), np.zeros_like(live)
            for slot in np.flatnonzero(emit & slots.has_stop_str).tolist():
                stopped[slot] = self._stop_string_hit(entries[slot], int(out[slot]))
            for slot in np.flatnonzero(emit & slots.constrained).tolist():
                grammar = self._grammar_advance(entries[slot], int(out[slot]))
                stopped[slot] |= grammar == "stop"
                broken[slot] = grammar == "error"
            ended |= live & (stopped | broken)
        for slot in np.flatnonzero(ended).tolist():
            entry = entries[slot]
            if drawn.nonfinite[slot] or (broken is not None and broken[slot]):
                if entry.error is None:  # else the grammar broke
                    entry.fail(ErrorCode.NONFINITE_LOGITS, "non-finite logits")
                self._finish(entry, FinishReason.ERROR)
            else:
                if drawn.stop_hit[slot]:
                    entry.stop_token = int(out[slot])
                    if scored is not None and slots.wants_logprobs[slot]:
                        entry.stop_logprobs = scored.row(slot)
                self._finish(entry, FinishReason.STOP if stopped[slot] else FinishReason.LENGTH)
