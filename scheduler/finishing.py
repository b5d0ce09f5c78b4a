"""How a request ends (scheduler/loop.py calls it): each emitted token checked (the first one
after prefill, then the grammar and the stop strings), and a request made final: its slot
freed, its final state read or its turn state cached as asked, its output reported."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, NamedTuple, cast

import numpy as np

from rwkv7_core.engine import Engine, Logprobs
from rwkv7_core.sampling import NONFINITE_TOKEN, TokenLogprobs
from rwkv7_core.stop_strings import StopMatcher

from .books import Books, Entry
from .errors import ErrorCode, FinishReason
from .prefill import Prefill
from .request import RequestOutput
from .slots import SlotTable
from .stats import RequestRecord, Stats

log = logging.getLogger(__name__)


class RunCallbacks(NamedTuple):
    """A run's callbacks (``Scheduler.run`` documents them); None: not asked for."""
    on_token: Callable[[str, int], None] | None = None
    on_finish: Callable[[RequestOutput], None] | None = None
    on_logprobs: Callable[[str, TokenLogprobs], None] | None = None


class Finisher:
    """Ends the requests of a run on ``engine``: the books, the decode batch's slot table, the
    prefill (its turn cache) and ``results`` are the scheduler's, shared; ``calls`` is the
    current run's callbacks."""

    def __init__(self, engine: Engine, tokenizer, stats: Stats, books: Books, slots: SlotTable, prefill: Prefill,
                 results: dict[str, RequestOutput], prefill_lock: threading.Lock):
        self.engine, self.tokenizer, self.stats = engine, tokenizer, stats
        self.results, self.prefill_lock = results, prefill_lock
        self._books, self._slots, self._prefill = books, slots, prefill
        self.calls = RunCallbacks()

    def ended_on_first(self, entry: Entry) -> bool:
        """Account the first token; True (and the entry final) if the request ended."""
        token = entry.first_token
        if token == NONFINITE_TOKEN:
            entry.fail(ErrorCode.NONFINITE_LOGITS, "non-finite logits")
            self.finish(entry, FinishReason.ERROR)
        elif entry.params.max_tokens == 0:  # prefilled only for its final state
            self.finish(entry, FinishReason.LENGTH)
        elif token in entry.params.stop_tokens:
            entry.stop_token = token
            if entry.params.logprobs is not None:
                entry.stop_logprobs = cast(Logprobs, self.engine).row_logprobs(entry.row, token)
            self.finish(entry, FinishReason.STOP)
        else:
            self._emit_first(entry, token)
            grammar = self.grammar_advance(entry, token)
            if grammar is not None:
                self.finish(entry, grammar)
            elif len(entry.tokens) >= entry.params.max_tokens:
                self.finish(entry, FinishReason.LENGTH)
            elif entry.params.stop and self.stop_string_hit(entry, token):
                self.finish(entry, FinishReason.STOP)
            else:
                return False
        return True

    def _emit_first(self, entry: Entry, token: int) -> None:
        """The first token (drawn after prefill, scored on the row's logits if asked)."""
        entry.tokens.append(token)
        entry.last_emit = time.perf_counter()
        if entry.params.logprobs is not None and self.calls.on_logprobs is not None:
            self.calls.on_logprobs(entry.id, cast(Logprobs, self.engine).row_logprobs(entry.row, token))
        if self.calls.on_token is not None:
            self.calls.on_token(entry.id, token)

    def grammar_advance(self, entry: Entry, token: int) -> FinishReason | None:
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

    def stop_string_hit(self, entry: Entry, token: int) -> bool:
        """True when ``token``, the newest, completes a stop string (called once per token;
        the matcher reads each token's bytes once: rwkv7_core/stop_strings.py)."""
        if entry.stop_matcher is None:
            entry.stop_matcher = StopMatcher(entry.params.stop)
        return entry.stop_matcher.feed_bytes(self.tokenizer.decode_bytes([token]))[1] >= 0

    def finish(self, entry: Entry, reason: FinishReason) -> None:
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

    def report_finals(self) -> None:
        """Hand every final request's output over (``on_finish`` or ``results``) and forget it."""
        for entry in self._books.take_finals():
            out = entry.output()
            self.stats.record_request(RequestRecord(
                entry.id, out.prompt_tokens, entry.cached_tokens, entry.prefill_seconds, out.ttft,
                out.generated_tokens, out.finish_reason, out.arrival_time, out.finish_time))
            self._books.forget(entry)
            if self.calls.on_finish is not None:
                self.calls.on_finish(out)
            else:
                self.results[entry.id] = out
