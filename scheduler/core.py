"""The scheduler: prefill in a worker thread, bucketed batched decode in the caller's.

The books are kept apart: ``Books`` (scheduler/books.py) holds every request's state and
queue, ``SlotTable`` (scheduler/slots.py) the decode batch's slots, ``Prefill``
(scheduler/prefill.py) the prompts in progress, reporting what each call produced, and
``StepLoop`` (scheduler/loop.py) owns the threads that drive the engine and move requests
between them. This module is the API: requests enter here (validated, tracked in the books),
and ``run`` hands them to the step loop.

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
from typing import Callable, Sequence, cast

import numpy as np

from rwkv7_core.engine import Capability, Engine, Logprobs, ReportsCompiles, check_capabilities
from rwkv7_core.sampling import TokenLogprobs

from .books import Books, Entry
from .config import PrefillPolicy, SchedulerConfig
from .errors import ErrorCode, FinishReason
from .grammar import matcher_for
from .loop import StepLoop
from .prefill import Prefill, check_engine_supports
from .prefix_cache import PrefixCache
from .prefix_disk import DiskPrefixStore
from .request import Request, RequestOutput, RequestState
from .stats import CompileEvent, Stats
from .validation import check_group, validated


class Scheduler:
    """Schedules requests on an ``Engine``; see the module docstring.

    ``tokenizer``: any object with ``decode_bytes(list[int]) -> bytes`` (UTF-8); needed for
    stop strings.
    ``prefix_store``: a persistent tier for the prefix cache (on even when
    ``config.prefix_cache_bytes`` is 0, which then keeps nothing in memory).
    ``results``: {id: RequestOutput} of the requests finished by runs given no ``on_finish``
    callback (``generate()`` reads it; take what you read out of it). A run with a callback
    hands each result only to it, so nothing of a request outlives its callback.
    ``stats``: bounded ``Stats`` aggregates of the runs so far.
    ``logprobs_unsupported``: why this engine and prefill policy cannot serve token logprobs
    (None: they can); a request asking for them fails with it.
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
        self._books = Books()
        self._seed_rng = np.random.default_rng()
        if Capability.REPORTS_COMPILES in engine.capabilities:
            cast(ReportsCompiles, engine).add_compile_listener(lambda what, start, seconds: self.stats.record_compile(
                CompileEvent(start, what, seconds)))
        self._policy = PrefillPolicy(self.config.prefill_policy)  # validated: a member already
        check_engine_supports(engine, self._policy)
        prefix = (PrefixCache(self.config.prefix_cache_bytes, prefix_store)
                  if self.config.prefix_cache_bytes or prefix_store is not None else None)
        self._prefill = Prefill(engine, self._policy, self.config.chunk, self.stats, prefix,
                                self.config.prefix_block, self.config.turn_cache)
        self._loop = StepLoop(engine, self.config, tokenizer, self.stats, self._books, self._prefill, self.results,
                              self.prefill_lock)
        self.logprobs_unsupported: str | None = None
        if Capability.LOGPROBS not in engine.capabilities or self._policy is PrefillPolicy.MIXED:
            self.logprobs_unsupported = (f"logprobs need an engine with {Capability.LOGPROBS} and a serial or "
                                          f"varlen prefill ({type(engine).__name__}, {self._policy.value})")

    # ---- public API -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request. An invalid one is not raised: it finishes FAILED with a message
        (reported by ``run``). The id of a request in flight or in ``results`` raises
        ValueError (ids handed to ``on_finish`` are forgotten, and may be reused)."""
        entry = self._new_entry(request)
        if self._needs_prefill(entry):
            self._books.move(entry, RequestState.WAITING)

    def add_group(self, requests: Sequence[Request]) -> None:
        """Queue requests that share one prompt (e.g. the ``n`` choices of one completion):
        the prompt is prefilled once and each request then draws from, and decodes, its own
        copy of that row with its own params (seed). Invalid ones finish FAILED alone."""
        check_group(requests)
        runnable = [e for e in [self._new_entry(r) for r in requests] if self._needs_prefill(e)]
        if runnable:
            runnable[0].forks = runnable[1:]
            self._books.move(runnable[0], RequestState.WAITING)

    def cancel(self, request_id: str) -> None:
        """Cancel a request (any thread). A waiting one is dropped at once; a running one
        leaves the batch before the next step. Finishes with finish_reason "cancelled"."""
        self._books.cancel(request_id)

    def score(self, tokens: Sequence[int]) -> TokenLogprobs:
        """The prompt's own token logprobs (``Logprobs.prompt_logprobs``: N = len(tokens) - 1),
        run under ``prefill_lock`` beside decode; any thread. ValueError without the capability."""
        if Capability.LOGPROBS not in self.engine.capabilities:
            raise ValueError(f"{type(self.engine).__name__} has no {Capability.LOGPROBS}")
        with self.prefill_lock:
            return cast(Logprobs, self.engine).prompt_logprobs(np.asarray(tokens, np.int32))

    def queue_sizes(self) -> dict[str, int]:
        """{"waiting", "prefill", "ready", "running"}: requests in each state now (any thread)."""
        return self._books.queue_sizes()

    def decode_buckets(self) -> list[int]:
        """[the engine's decode bucket now] (0 before the first step; any thread)."""
        return [self.engine.bucket]

    def state(self, request_id: str) -> RequestState | None:
        """A request's state now; None once its result is handed over (or for an unknown id)."""
        return self._books.state(request_id)

    def unstarted(self) -> list[str]:
        """Ids of requests still WAITING (e.g. after ``should_stop`` ended a run)."""
        return self._books.unstarted()

    def precompile(self) -> None:
        """Compile every executable a run can call (``StepLoop.precompile``: the buckets, the
        policy's prefill shapes, the logprob paths); once; ``run`` does it first when
        ``config.precompile``."""
        self._loop.precompile()

    def run(self, on_token: Callable[[str, int], None] | None = None,
            on_finish: Callable[[RequestOutput], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_logprobs: Callable[[str, TokenLogprobs], None] | None = None,
            serve_until: Callable[[], bool] | None = None) -> None:
        """Drive until every added request is final. ``on_token(id, token)`` streams each
        emitted token; ``on_logprobs(id, TokenLogprobs of N=1)`` comes just before it for
        requests with ``params.logprobs``; ``on_finish(output)`` fires once per request. When
        ``should_stop()`` returns True no more requests start; those already decoding run to
        completion, those still in prefill go back to WAITING with the unstarted ones (not
        reported). With ``serve_until`` the run does not end when idle: it waits for new
        requests (``add`` from any thread) and returns once idle with ``serve_until()`` True
        (checked every 50 ms). Callbacks run in this thread. Without ``on_finish`` the outputs
        collect in ``results``. An exception that ends the prefill thread ends the run:
        ``SchedulerFailed``, from it."""
        self._loop.run(on_token, on_finish, should_stop, on_logprobs, serve_until)

    # ---- entering -----------------------------------------------------------------------
    def _new_entry(self, request: Request) -> Entry:
        """A tracked, validated entry; an invalid one is final ("error") at once."""
        if self._books.state(request.id) is not None or request.id in self.results:
            raise ValueError(f"duplicate request id {request.id!r}")
        entry = Entry(request, time.perf_counter())
        self._books.track(entry)
        try:
            entry.params, entry.prompt = validated(request, self.engine.vocab_size, self.tokenizer,
                                                   self.logprobs_unsupported, self.config.max_tokens_limit)
            if request.constraint is not None:  # compiled (or taken from the cache) before any decode work
                entry.matcher = matcher_for(request.constraint, self.engine, self.tokenizer)
        except (ValueError, TypeError) as e:
            entry.fail(ErrorCode.INVALID_REQUEST, f"invalid request: {e}")
            self._books.finish(entry, FinishReason.ERROR)
            return entry
        if entry.params.seed is None:
            entry.params = entry.params.replace(seed=int(self._seed_rng.integers(2**64, dtype=np.uint64)))
        return entry

    def _needs_prefill(self, entry: Entry) -> bool:
        """Valid, and something to draw (or a final state to return); else final now."""
        if entry.state.is_final:
            return False
        if entry.params.max_tokens > 0 or entry.request.return_state:
            return True
        self._books.finish(entry, FinishReason.LENGTH)
        return False
