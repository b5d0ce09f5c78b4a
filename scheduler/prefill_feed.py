"""The prefill side of a run (scheduler/loop.py drives it): waiting requests move into the
prefill (scheduler/prefill.py) while the batch has room, the worker thread runs the prefill
calls (SERIAL / VARLEN / AUTO), and each finished prompt is handed over READY with its
group's forks, or final when it failed."""
from __future__ import annotations

import threading
import time

from rwkv7_core.engine import Engine

from .books import Books, Entry
from .errors import ErrorCode, FinishReason
from .prefill import Prefill, PrefillReport, draw_first
from .request import RequestState
from .stats import Stats


class PrefillFeed:
    """Feeds ``prefill`` from the books. The run thread sets ``admitting`` (admissions open)
    and ``stop`` (the worker ends) under the books' cond; ``death`` is the exception that
    ended the worker thread, for the run thread to raise."""

    def __init__(self, engine: Engine, max_batch: int, stats: Stats, books: Books, prefill: Prefill,
                 prefill_lock: threading.Lock):
        self.engine, self.max_batch, self.stats = engine, max_batch, stats
        self.books, self.prefill, self.prefill_lock = books, prefill, prefill_lock
        self.admitting = True
        self.stop = False
        self.death: BaseException | None = None

    def can_start(self) -> bool:
        """A waiting request may start prefill: admissions are open and the batch has room
        for it beside the live, ready and prefilling ones (caller holds the books' cond)."""
        books = self.books
        return bool(self.admitting and books.waiting and books.running + len(books.ready)
                    + books.prefilling < self.max_batch)

    def worker(self) -> None:
        """SERIAL / VARLEN / AUTO: prefill calls beside decode, until the run ends; an
        exception that escapes ends the run too (``run`` raises it)."""
        self.stats.set_role("prefill")
        try:
            self._calls()
        except BaseException as e:  # noqa: BLE001 - handed to the run thread
            self.death = e

    def _calls(self) -> None:
        books = self.books
        while True:
            with books.cond:
                books.cond.wait_for(lambda: self.stop or self.prefill or self.can_start(), timeout=0.05)
                if self.stop:
                    return
            self.start_pieces()
            if self.prefill:
                with self.prefill_lock:
                    report = self.prefill.run()
                self.hand_over(report)

    def start_pieces(self) -> None:
        """Move waiting requests into the prefill queue while it wants more; once admissions
        stop, prompts still in prefill go back to waiting (unstarted: a later run redoes them)."""
        books = self.books
        with books.cond:
            if not self.admitting:
                for entry in self.prefill.abandon():
                    books.move(entry, RequestState.WAITING)
            while self.prefill.wants_more() and self.can_start():
                entry = books.waiting[0]
                books.move(entry, RequestState.PREFILL)
                failed = self.prefill.add(entry)
                if failed is not None:
                    self.hand_over(PrefillReport([failed], None, [], 0, 0))

    def hand_over(self, report: PrefillReport) -> None:
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
                    self.books.move(member, RequestState.READY)
                else:
                    self.books.finish(member, FinishReason.ERROR)

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
