"""The scheduler: prefill in a worker thread, bucketed batched decode in the caller's.

Threads: ``run()`` drives decode steps in the calling thread; one prefill worker takes
WAITING requests in arrival order, prefills them under ``prefill_lock`` (one prompt per
call for SERIAL, flattened pieces for VARLEN; scheduler/prefill.py, using the prefix
cache), draws each first token and hands the request over as READY.
Every loop iteration of ``run()``: report finished/cancelled requests, admit READY requests
(at most ``max_batch`` live rows), resize the batch to the smallest bucket holding the live
rows plus the prompt in prefill (which joins soon: no shrink-then-grow) if that differs
from the current one (compacting live slots to the front; compiling a new bucket first
unless precompiled; a shrink to a bucket not compiled yet only when it saves more decode
time than the compile costs, ``config.shrink_pays``), insert the admitted rows into free
slots, run one engine step, and account the drawn tokens. MIXED has no worker and runs prompt chunks inside the decode
step.
Serving: ``run(serve_until=...)`` keeps waiting for new requests (added from any thread)
instead of returning when idle; ``add_group`` prefills one prompt once for several
requests (n choices), each then decoding its own copy of the row; requests with
``params.logprobs`` get each token's TokenLogprobs through ``on_logprobs`` (engines with
``Capability.LOGPROBS``); ``score`` gives a prompt's own token logprobs. An engine's declared
capabilities (rwkv7_core/engine.py) are checked once, when the scheduler is built.

Memory stays flat over any number of requests: a request's bookkeeping is dropped once its
result is handed over (to ``on_finish``, or into ``results`` for runs without one), and
``stats`` holds bounded aggregates (scheduler/stats.py).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Mapping, Sequence

import numpy as np

from rwkv7_core.engine import Capability, Engine, check_capabilities
from rwkv7_core.sampling import NONFINITE_TOKEN, SamplingParams, TokenLogprobs

from .config import PrefillPolicy, SchedulerConfig, bucket_for, shrink_pays
from .prefill import Prefill, check_engine_supports
from .prefix_cache import PrefixCache
from .prefix_disk import DiskPrefixStore
from .request import Request, RequestOutput, RequestState, final_state
from .stats import BucketSwitch, CompileEvent, RequestRecord, Stats

_NO_TOKEN = -2  # padding in the per-slot stop-token table


class _Entry:
    """Scheduler-side bookkeeping of one request."""

    def __init__(self, request: Request, arrival: float):
        self.id = request.id
        self.request = request
        self.params: SamplingParams | None = None
        self.prompt: list[int] = []
        self.initial = request.initial_state
        self.state = RequestState.WAITING
        self.times = {RequestState.WAITING: arrival}
        self.arrival = arrival
        self.tokens: list[int] = []
        self.row = None
        self.first_token: int | None = None
        self.first_token_time: float | None = None
        self.last_emit = 0.0  # perf_counter of its newest token (inter-token gaps)
        self.cached_tokens = 0
        self.prefill_seconds: float | None = None
        self.error: str | None = None
        self.cancel_requested = False
        self.slot = -1
        self.forks: list[_Entry] = []  # requests sharing this one's prefill (add_group)

    def set_state(self, state: RequestState) -> None:
        self.state = state
        self.times[state] = time.perf_counter()


class Scheduler:
    """Schedules requests on an ``Engine``; see the module docstring.

    ``tokenizer``: any object with ``decode(list[int]) -> str``; needed for stop strings.
    ``prefix_store``: a persistent tier for the prefix cache (on even when
    ``config.prefix_cache_bytes`` is 0, which then keeps nothing in memory).
    ``results``: {id: RequestOutput} of the requests finished by runs given no ``on_finish``
    callback (``generate()`` reads it; take what you read out of it). A run with a callback
    hands each result only to it, so nothing of a request outlives its callback.
    ``stats``: bounded ``Stats`` aggregates of the runs so far.
    TypeError when the engine's declared ``capabilities`` lie (``check_capabilities``);
    ValueError when it lacks the one the prefill policy needs.
    """

    def __init__(self, engine: Engine, config: SchedulerConfig | None = None, tokenizer=None,
                 prefix_store: DiskPrefixStore | None = None):
        check_capabilities(engine)
        self.engine = engine
        self.config = (config or SchedulerConfig()).validated()
        self.tokenizer = tokenizer
        self.stats = Stats(self.config.stats_records)
        self.results: dict[str, RequestOutput] = {}
        self.prefill_lock = threading.Lock()
        self._prefix = (PrefixCache(self.config.prefix_cache_bytes, prefix_store)
                        if self.config.prefix_cache_bytes or prefix_store is not None else None)
        self._seed_rng = np.random.default_rng()
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        self._waiting: deque[_Entry] = deque()   # guarded by _cond
        self._ready: deque[_Entry] = deque()     # guarded by _cond
        self._finals: deque[_Entry] = deque()    # final before reaching the batch; guarded by _cond
        self._cancels: set[str] = set()          # guarded by _cond
        self._prefilling = 0                     # guarded by _cond
        self._live_count = 0                     # guarded by _cond (copy of the main thread's)
        self._admitting = True
        self._stop_worker = False
        self._compiled: set[int] = set()
        self._bucket_compile_seconds = 0.0       # the last bucket compile's seconds
        self._step_seconds: dict[int, float] = {}  # bucket -> recent decode step seconds
        self._prefill_compiled = False
        self._on_token = self._on_finish = self._on_logprobs = None
        self._resize_slots(0, [])
        if Capability.REPORTS_COMPILES in engine.capabilities:
            engine.add_compile_listener(lambda what, start, seconds: self.stats.record_compile(
                CompileEvent(start, what, seconds)))
        self._policy = self.config.prefill_policy
        check_engine_supports(engine, self._policy)
        self._pieces = Prefill(engine, self._policy, self.config.chunk, self.stats, self._prefix,
                               self.config.prefix_block)

    # ---- public API -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request. An invalid one is not raised: it finishes FAILED with a message
        (reported by ``run``). The id of a request in flight or in ``results`` raises
        ValueError (ids handed to ``on_finish`` are forgotten, and may be reused)."""
        entry = self._new_entry(request)
        with self._cond:
            if not self._needs_prefill(entry):
                self._finals.append(entry)
            else:
                self._waiting.append(entry)
            self._cond.notify_all()

    def add_group(self, requests: Sequence[Request]) -> None:
        """Queue requests that share one prompt (e.g. the ``n`` choices of one completion):
        the prompt is prefilled once and each request then draws from, and decodes, its own
        copy of that row with its own params (seed). Invalid ones finish FAILED alone."""
        if (len({tuple(np.asarray(r.prompt_tokens).ravel().tolist()) for r in requests}) > 1
                or any(r.initial_state is not requests[0].initial_state for r in requests)):
            raise ValueError("add_group needs requests with the same prompt_tokens and initial_state")
        entries = [self._new_entry(r) for r in requests]
        runnable = [e for e in entries if self._needs_prefill(e)]
        with self._cond:
            self._finals.extend(e for e in entries if e not in runnable)
            if runnable:
                runnable[0].forks = runnable[1:]
                self._waiting.append(runnable[0])
            self._cond.notify_all()

    def queue_sizes(self) -> dict[str, int]:
        """{"waiting", "prefill", "ready", "running"}: requests in each state now (any thread)."""
        with self._cond:
            waiting = len(self._waiting) + sum(len(e.forks) for e in self._waiting)
            return {"waiting": waiting, "prefill": self._prefilling, "ready": len(self._ready),
                    "running": self._live_count}

    def score(self, tokens: Sequence[int]) -> TokenLogprobs:
        """The prompt's own token logprobs (``Logprobs.prompt_logprobs``: N = len(tokens) - 1),
        run under ``prefill_lock`` beside decode; any thread. ValueError without the capability."""
        if Capability.LOGPROBS not in self.engine.capabilities:
            raise ValueError(f"{type(self.engine).__name__} has no {Capability.LOGPROBS}")
        with self.prefill_lock:
            return self.engine.prompt_logprobs(np.asarray(tokens, np.int32))

    @staticmethod
    def _needs_prefill(entry: _Entry) -> bool:
        """Valid, and something to draw (or a final state to return)."""
        return entry.error is None and (entry.params.max_tokens > 0 or entry.request.return_state)

    def _new_entry(self, request: Request) -> _Entry:
        """A registered, validated entry (``error`` set when invalid)."""
        if request.id in self._entries or request.id in self.results:
            raise ValueError(f"duplicate request id {request.id!r}")
        entry = _Entry(request, time.perf_counter())
        self._entries[request.id] = entry
        try:
            entry.params, entry.prompt = self._validated(request)
        except (ValueError, TypeError) as e:
            entry.error = f"invalid request: {e}"
        return entry

    def cancel(self, request_id: str) -> None:
        """Cancel a request (any thread). A waiting one is dropped at once; a running one
        leaves the batch before the next step. Finishes with finish_reason "cancelled"."""
        with self._cond:
            entry = self._entries.get(request_id)
            if entry is None or entry.state.is_final:
                return
            if entry.state is RequestState.WAITING and entry in self._waiting and not entry.forks:
                self._waiting.remove(entry)
                entry.cancel_requested = True
                self._finals.append(entry)
            else:
                self._cancels.add(request_id)
            self._cond.notify_all()

    @property
    def live_count(self) -> int:
        """Rows decoding now."""
        return self._live_count

    def unstarted(self) -> list[str]:
        """Ids of requests still WAITING (e.g. after ``should_stop`` ended a run)."""
        with self._cond:
            return [f.id for e in self._waiting for f in [e, *e.forks]]

    def run(self, on_token: Callable[[str, int], None] | None = None,
            on_finish: Callable[[RequestOutput], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_logprobs: Callable[[str, TokenLogprobs], None] | None = None,
            serve_until: Callable[[], bool] | None = None) -> None:
        """Drive until every added request is final. ``on_token(id, token)`` streams each
        emitted token; ``on_logprobs(id, TokenLogprobs of N=1)`` comes just before it for
        requests with ``params.logprobs``; ``on_finish(output)`` fires once per request. When
        ``should_stop()`` returns True no more requests start; those already started run to
        completion and unstarted ones stay WAITING (not reported). With ``serve_until`` the
        run does not end when idle: it waits for new requests (``add`` from any thread) and
        returns once idle with ``serve_until()`` True (checked every 50 ms). Callbacks run
        in this thread. Without ``on_finish`` the outputs collect in ``results``."""
        self._on_token, self._on_finish, self._on_logprobs = on_token, on_finish, on_logprobs
        self._admitting = True
        self._stop_worker = False
        if self.config.precompile:
            self._ensure_compiled(self.config.buckets)
            self._precompile_prefill()
        worker = threading.Thread(target=None if self._policy is PrefillPolicy.MIXED else self._prefill_worker,
                                  name="prefill", daemon=True)
        worker.start()
        try:
            while True:
                if self._admitting and should_stop is not None and should_stop():
                    with self._cond:
                        self._admitting = False
                self._report_finals()
                self._apply_cancels()
                admitted = self._take_ready()
                if self._policy is PrefillPolicy.MIXED:
                    self._start_pieces()
                if not self._live and not admitted and not self._mixed_work():
                    with self._cond:
                        if self._idle() and (serve_until is None or serve_until()):
                            break
                        self._cond.wait_for(lambda: self._ready or self._finals or self._cancels,
                                            timeout=0.05)
                    continue
                self._decode_step(admitted)
        finally:
            with self._cond:
                self._stop_worker = True
                self._cond.notify_all()
            worker.join()
            self._report_finals()

    # ---- validation -------------------------------------------------------------------
    def _validated(self, request: Request) -> tuple[SamplingParams, list[int]]:
        params = request.params
        if isinstance(params, Mapping):
            params = SamplingParams.from_dict(params)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams or a dict, got {type(params).__name__}")
        vocab = self.engine.vocab_size
        params.validate(vocab)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (Scheduler(tokenizer=...))")
        if params.logprobs is not None and (Capability.LOGPROBS not in self.engine.capabilities
                                            or self._policy is PrefillPolicy.MIXED):
            raise ValueError(f"logprobs need an engine with {Capability.LOGPROBS} and a serial or varlen "
                             f"prefill ({type(self.engine).__name__}, {self._policy.value})")
        prompt = np.asarray(request.prompt_tokens)
        if prompt.ndim != 1 or prompt.size == 0:
            raise ValueError("prompt_tokens is empty" if prompt.size == 0
                             else f"prompt_tokens must be a flat list, got shape {prompt.shape}")
        if prompt.dtype.kind not in "iu":
            raise ValueError(f"prompt_tokens must be integers, got {prompt.dtype}")
        bad = np.flatnonzero((prompt < 0) | (prompt >= vocab))
        if bad.size:
            raise ValueError(f"prompt token {int(prompt[bad[0]])} at position {int(bad[0])} is "
                             f"outside the vocabulary [0, {vocab})")
        if params.seed is None:
            params = params.replace(seed=int(self._seed_rng.integers(2**32)))
        return params, prompt.tolist()

    # ---- prefill (scheduler/prefill.py) ----------------------------------------------
    def _can_start(self) -> bool:
        """A waiting request may start prefill: admissions are open and the batch has room
        for it beside the live, ready and prefilling ones (caller holds _cond)."""
        return bool(self._admitting and self._waiting and self._live_count + len(self._ready)
                    + self._prefilling < self.config.max_batch)

    def _prefill_worker(self) -> None:
        """SERIAL / VARLEN / AUTO: prefill calls beside decode, until the run ends."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop_worker or self._pieces or self._can_start(),
                                    timeout=0.05)
                if self._stop_worker:
                    return
            self._start_pieces()
            if self._pieces:
                with self.prefill_lock:
                    self._pieces.run()
                self._hand_over_pieces()

    def _mixed_work(self) -> bool:
        return self._policy is PrefillPolicy.MIXED and len(self._pieces) > 0

    def _start_pieces(self) -> None:
        """Move waiting requests into the prefill queue while it wants more."""
        with self._cond:
            while self._pieces.wants_more() and self._can_start():
                entry = self._waiting.popleft()
                entry.set_state(RequestState.PREFILL)
                self._prefilling += 1
                self._pieces.add(entry)
        self._hand_over_pieces()

    def _hand_over_pieces(self, only_for: PrefillPolicy | None = None) -> None:
        """Prompts the prefill queue finished (or failed) become READY. Only the thread
        running the pieces calls this (``only_for`` names that policy)."""
        if (only_for is not None and self._policy is not only_for) or not self._pieces.completed:
            return
        done, self._pieces.completed = self._pieces.completed, []
        forks = [fork for entry in done for fork in self._forked(entry)]
        with self._cond:
            self._prefilling -= len(done)
            for entry in done + forks:
                if entry.error is None:
                    entry.set_state(RequestState.READY)
                self._ready.append(entry)
            self._cond.notify_all()

    def _forked(self, entry: _Entry) -> list[_Entry]:
        """The forks of a prefilled entry, each holding the shared row (engines copy a row on
        insert, never alias it) and the first token drawn with its own params."""
        forks, entry.forks = entry.forks, []
        for fork in forks:
            fork.cached_tokens, fork.prefill_seconds = entry.cached_tokens, entry.prefill_seconds
            fork.error = entry.error
            if entry.error is None:
                fork.row = entry.row
                fork.first_token = int(self.engine.sample(entry.row, fork.params, 0))
                fork.first_token_time = time.perf_counter()
        return forks

    # ---- main-thread bookkeeping ------------------------------------------------------
    def _idle(self) -> bool:
        """Nothing left to do in this run (caller holds _cond)."""
        return (not self._ready and not self._finals and not self._prefilling and not self._live
                and not (self._admitting and self._waiting))

    def _report_finals(self) -> None:
        with self._cond:
            finals, self._finals = list(self._finals), deque()
        for entry in finals:
            self._finish(entry, self._final_reason(entry) or "length")  # "length": max_tokens == 0

    @staticmethod
    def _final_reason(entry: _Entry) -> str | None:
        """"error" or "cancelled" for an entry that failed or was cancelled before decoding."""
        if entry.error is not None:
            return "error"
        return "cancelled" if entry.cancel_requested else None

    def _apply_cancels(self) -> None:
        if not self._cancels:
            return
        with self._cond:
            ids, self._cancels = self._cancels, set()
        for request_id in ids:
            entry = self._entries.get(request_id)
            if entry is None:  # it finished meanwhile
                continue
            if entry.state is RequestState.RUNNING:
                self._finish(entry, "cancelled")
            elif not entry.state.is_final:
                entry.cancel_requested = True  # finished when it comes out of prefill
        with self._cond:
            self._live_count = len(self._live)
            self._cond.notify_all()

    def _take_ready(self) -> list[_Entry]:
        """Pop READY entries that fit in max_batch; account their first tokens."""
        admitted: list[_Entry] = []
        room = self.config.max_batch - len(self._live)
        while len(admitted) < room:
            with self._cond:
                if not self._ready:
                    break
                entry = self._ready.popleft()
            reason = self._final_reason(entry)
            if reason is not None:
                self._finish(entry, reason)
            elif self._accept_first(entry) is None:
                admitted.append(entry)
        return admitted

    def _accept_first(self, entry: _Entry) -> str | None:
        """Account the first token; returns the finish reason if the request ended."""
        token = entry.first_token
        if token == NONFINITE_TOKEN:
            entry.error = "non-finite logits"
            return self._finish(entry, "error")
        if entry.params.max_tokens == 0:  # prefilled only for its final state
            return self._finish(entry, "length")
        if token in entry.params.stop_tokens:
            return self._finish(entry, "stop", stop_token=True)
        self._emit(entry, token)
        if len(entry.tokens) >= entry.params.max_tokens:
            return self._finish(entry, "length")
        if entry.params.stop and self._stop_string_hit(entry):
            return self._finish(entry, "stop")
        return None

    def _emit(self, entry: _Entry, token: int) -> None:
        """The first token (drawn after prefill, scored on the row's logits if asked)."""
        entry.tokens.append(token)
        entry.last_emit = time.perf_counter()
        if entry.params.logprobs is not None and self._on_logprobs is not None:
            self._on_logprobs(entry.id, self.engine.row_logprobs(entry.row, token))
        if self._on_token is not None:
            self._on_token(entry.id, token)

    def _stop_string_hit(self, entry: _Entry) -> bool:
        """True when a stop string ends within the text of the newest tokens."""
        stops = entry.params.stop
        window = 4 * max(len(s) for s in stops) + 2  # a token holds >= 1 byte, a char <= 4
        try:
            text = self.tokenizer.decode(entry.tokens[-window:])
        except Exception:  # an incomplete UTF-8 sequence: no match yet
            return False
        return any(s in text for s in stops)

    def _finish(self, entry: _Entry, reason: str, stop_token: bool = False) -> str:
        """Make a request final (``stop_token``: it ended on a stop token, which the state
        has not consumed and never will)."""
        final = None
        if entry.request.return_state and reason in ("length", "stop"):
            try:
                final = self._final_state(entry, pending=bool(entry.tokens) and not stop_token)
            except Exception as e:
                entry.error, reason = f"reading the final state failed: {type(e).__name__}: {e}", "error"
        slot = entry.slot
        if slot >= 0:
            self._slot_entry[slot] = None
            self._live_mask[slot] = False
            del self._live[entry.id]
            entry.slot = -1
        state = final_state(reason)
        entry.set_state(state)
        entry.row = None
        out = RequestOutput(id=entry.id, tokens=entry.tokens, finish_reason=reason, error=entry.error,
                            prompt_tokens=len(entry.prompt) or len(entry.request.prompt_tokens),
                            generated_tokens=len(entry.tokens), arrival_time=entry.arrival,
                            first_token_time=entry.first_token_time, finish_time=entry.times[state],
                            final_state=final)
        self.stats.record_request(RequestRecord(
            entry.id, out.prompt_tokens, entry.cached_tokens, entry.prefill_seconds, out.ttft,
            out.generated_tokens, reason, out.arrival_time, out.finish_time))
        del self._entries[entry.id]
        if self._on_finish is not None:
            self._on_finish(out)
        else:
            self.results[entry.id] = out
        return reason

    def _final_state(self, entry: _Entry, pending: bool):
        """Host row after the prompt and every emitted token: the slot's (or, before the batch,
        the prefill row's) state, run through the last emitted token when it is ``pending``
        (drawn but not yet fed: every finish but a stop token's)."""
        row = self.engine.extract(entry.slot) if entry.slot >= 0 else entry.row
        if pending:
            with self.prefill_lock:
                row = self.engine.prefill(np.array(entry.tokens[-1:], np.int32), row)
        return self.engine.to_host(row)

    # ---- batch ------------------------------------------------------------------------
    def _resize_slots(self, bucket: int, keep: list[int]) -> None:
        """Fresh per-slot host arrays for ``bucket`` slots; the entry in slot keep[i] moves
        to slot i with its last token."""
        old_entries = getattr(self, "_slot_entry", [])
        old_tok = getattr(self, "_tok", None)
        old_emit = getattr(self, "_last_emit", None)
        self._slot_entry: list[_Entry | None] = [None] * bucket
        self._tok = np.zeros(bucket, np.int32)
        self._pos = np.zeros(bucket, np.int32)
        self._remaining = np.zeros(bucket, np.int64)
        self._stops = np.full((bucket, 1), _NO_TOKEN, np.int32)
        self._has_stop_str = np.zeros(bucket, bool)
        self._wants_logprobs = np.zeros(bucket, bool)
        self._live_mask = np.zeros(bucket, bool)
        self._last_emit = np.zeros(bucket, np.float64)
        self._live: dict[str, _Entry] = {}
        for i, s in enumerate(keep):
            self._place(old_entries[s], i, int(old_tok[s]))
            self._last_emit[i] = old_emit[s]

    def _place(self, entry: _Entry, slot: int, last_token: int) -> None:
        p = entry.params
        entry.slot = slot
        self._slot_entry[slot] = entry
        self._live[entry.id] = entry
        self._live_mask[slot] = True
        self._tok[slot] = last_token
        self._last_emit[slot] = entry.last_emit
        self._pos[slot] = len(entry.tokens)
        self._remaining[slot] = p.max_tokens - len(entry.tokens)
        if len(p.stop_tokens) > self._stops.shape[1]:
            pad = np.full((len(self._stops), len(p.stop_tokens) - self._stops.shape[1]), _NO_TOKEN, np.int32)
            self._stops = np.concatenate([self._stops, pad], axis=1)
        self._stops[slot] = _NO_TOKEN
        self._stops[slot, :len(p.stop_tokens)] = p.stop_tokens
        self._has_stop_str[slot] = bool(p.stop)
        self._wants_logprobs[slot] = p.logprobs is not None

    def _ensure_compiled(self, buckets) -> None:
        todo = [b for b in buckets if b not in self._compiled]
        if not todo:
            return
        start = time.perf_counter()
        seconds = self.engine.compile(todo)
        self._bucket_compile_seconds = max(seconds.values())
        if Capability.REPORTS_COMPILES not in self.engine.capabilities:  # else its listener reported them
            for b in todo:
                self.stats.record_compile(CompileEvent(start, f"bucket {b}", seconds[b]))
        self._compiled.update(todo)


    def _precompile_prefill(self) -> None:
        """Once per scheduler: the prefill shapes the policy uses (so no compile mid-run)."""
        if self._prefill_compiled:
            return
        start = time.perf_counter()
        seconds = self._pieces.precompile(self.config.buckets)
        if Capability.REPORTS_COMPILES not in self.engine.capabilities:
            for what, s in seconds.items():
                self.stats.record_compile(CompileEvent(start, what, s))
        self._prefill_compiled = True

    def _decode_step(self, admitted: list[_Entry]) -> None:
        engine = self.engine
        with self._cond:  # a prompt in prefill joins soon: keep room for it (no shrink-then-grow)
            prefilling = self._prefilling
        rows = min(len(self._live) + len(admitted) + prefilling, self.config.max_batch)
        target = self._target_bucket(rows, admitted)
        try:
            if target != len(self._slot_entry):
                self._ensure_compiled([target])
                keep = sorted(e.slot for e in self._live.values())
                clock = self.stats.start_call()
                engine.resize(keep, target)
                self.stats.record_switch(BucketSwitch(clock[1], len(self._slot_entry), target, len(keep),
                                                      self.stats.call_seconds(clock)))
                self._resize_slots(target, keep)
            free = iter(np.flatnonzero(~self._live_mask).tolist())
            for entry in admitted:
                slot = next(free)
                engine.insert(slot, entry.row, entry.params)
                entry.row = None
                entry.set_state(RequestState.RUNNING)
                self._place(entry, slot, entry.first_token)
            with self._cond:
                self._live_count = len(self._live)
            clock = self.stats.start_call()
            scored = None
            if self._mixed_work():
                out = np.asarray(self._pieces.mixed_step(self._tok, self._pos))
            elif (self._wants_logprobs & self._live_mask).any():
                out, scored = engine.step_logprobs(self._tok, self._pos)
            else:
                out = np.asarray(engine.step(self._tok, self._pos))
            seconds = self.stats.call_seconds(clock)
        except Exception as e:  # fail this step's requests; the scheduler stays usable
            self._fail_batch(admitted, f"engine step failed: {type(e).__name__}: {e}")
            self._hand_over_pieces(PrefillPolicy.MIXED)
            return
        self._hand_over_pieces(PrefillPolicy.MIXED)
        self.stats.record_step(clock[1], target, len(self._live), engine.last_path, seconds)
        last = self._step_seconds.get(target)
        self._step_seconds[target] = seconds if last is None else 0.8 * last + 0.2 * seconds
        self._account(out, scored)

    def _target_bucket(self, rows: int, admitted: list[_Entry]) -> int:
        """The smallest bucket holding ``rows``, unless that is a shrink to a bucket not yet
        compiled that would not pay for its compile (then the current bucket)."""
        target, current = bucket_for(rows, self.config.buckets), len(self._slot_entry)
        if target >= current or target in self._compiled:
            return target
        steps_left = max([int(self._remaining[self._live_mask].max(initial=0))]
                         + [e.params.max_tokens - len(e.tokens) for e in admitted])
        if shrink_pays(current, target, self._step_seconds.get(current), steps_left,
                       self._bucket_compile_seconds):
            return target
        return current

    def _fail_batch(self, admitted: list[_Entry], message: str) -> None:
        failing = {**{e.id: e for e in admitted if not e.state.is_final}, **self._live}  # each once
        for entry in failing.values():
            entry.error = message
            self._finish(entry, "error")
        self._resize_slots(0, [])  # the next step asks the engine for a fresh batch
        with self._cond:
            self._live_count = 0
            self._cond.notify_all()

    def _account(self, out: np.ndarray, scored: TokenLogprobs | None = None) -> None:
        """Consume one step's drawn tokens [bucket] (and their scores, when some row asked)."""
        live = self._live_mask
        nonfinite = out == NONFINITE_TOKEN
        stop_hit = (out[:, None] == self._stops).any(axis=1)
        emit = live & ~nonfinite & ~stop_hit
        self._remaining -= emit
        self._pos += 1
        self._tok = np.where(out < 0, 0, out).astype(np.int32)
        tokens = out.tolist()
        entries = self._slot_entry
        on_token, on_logprobs = self._on_token, self._on_logprobs
        emitted = np.flatnonzero(emit)
        now = time.perf_counter()
        self.stats.inter_token.add_many(now - self._last_emit[emitted])
        self._last_emit[emitted] = now
        for slot in emitted.tolist():
            entry = entries[slot]
            entry.tokens.append(tokens[slot])
            if scored is not None and on_logprobs is not None and self._wants_logprobs[slot]:
                on_logprobs(entry.id, scored.row(slot))
            if on_token is not None:
                on_token(entry.id, tokens[slot])
        stopped = live & stop_hit
        for slot in np.flatnonzero(emit & self._has_stop_str).tolist():
            stopped[slot] = self._stop_string_hit(entries[slot])
        ended = live & (nonfinite | stopped | (self._remaining <= 0))
        if not ended.any():
            return
        for slot in np.flatnonzero(ended).tolist():
            entry = entries[slot]
            if nonfinite[slot]:
                entry.error = "non-finite logits"
                self._finish(entry, "error")
            else:
                self._finish(entry, "stop" if stopped[slot] else "length", stop_token=bool(stop_hit[slot]))
        with self._cond:
            self._live_count = len(self._live)
            self._cond.notify_all()
