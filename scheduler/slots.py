"""The decode batch's host side: which request holds each slot of the bucket, and the
per-slot arrays a step reads and updates. The one place a request moves into the batch
(``place``), within it (``resize``: compaction to the front on a bucket change) and out of
it (``remove``)."""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

NO_TOKEN = -2
"""Padding in the per-slot stop-token table (no drawn token equals it)."""

HISTORY_STEPS = 128
"""Steps of emitted tokens kept in the table's arrays before they are appended to their
holders' ``tokens`` lists in one pass (no per-row Python work in an ordinary step)."""


class Drawn(NamedTuple):
    """One step's drawn tokens sorted out per slot ([bucket] bool each; ``gaps``: seconds
    since each emitting slot's previous token, in slot order)."""
    emit: np.ndarray       # a live row emitted its token (not a stop token, not non-finite)
    nonfinite: np.ndarray  # the row's logits were not finite
    stop_hit: np.ndarray   # the token is one of the row's stop tokens
    gaps: np.ndarray       # float64 [emit.sum()]


def each(function, *iterables) -> None:
    """Call ``function`` on every item of the zipped ``iterables`` (a C-level loop)."""
    deque(map(function, *iterables), maxlen=0)


class SlotTable:
    """Per slot of a bucket of B slots: ``entries`` (the holder or None), ``tokens`` int32 [B]
    (last drawn token, fed to the next step), ``positions`` int32 [B], ``remaining`` int64 [B]
    (tokens the row may still draw), ``stops`` int32 [B, S] (its stop tokens padded with
    NO_TOKEN), ``has_stop_str``, ``wants_logprobs``, ``live`` bool [B], ``last_emit`` float64
    [B] (perf_counter of its newest token), ``matchers`` (the holder's grammar Matcher or None)
    and ``constrained`` bool [B] (it has one); object [B] views of the holders' ``ids`` and
    ``token_lists``. ``holders``: {request id: entry} of the live rows.

    Emitted tokens wait in ``history`` int32 [B, HISTORY_STEPS] (``emitted`` marks them) and
    reach a holder's ``tokens`` list when the window fills, on ``sync`` (all rows) and when
    it leaves its slot; read an entry's ``tokens`` only after ``settle``, ``sync`` or ``remove``."""

    def __init__(self):
        self._fresh(0)

    @property
    def bucket(self) -> int:
        return len(self.entries)

    def __len__(self) -> int:
        """Live rows."""
        return len(self.holders)

    def _fresh(self, bucket: int) -> None:
        self.entries: list = [None] * bucket
        self.ids = np.full(bucket, None, object)
        self.token_lists = np.full(bucket, None, object)
        self.tokens = np.zeros(bucket, np.int32)
        self.positions = np.zeros(bucket, np.int32)
        self.remaining = np.zeros(bucket, np.int64)
        self.stops = np.full((bucket, 1), NO_TOKEN, np.int32)
        self.has_stop_str = np.zeros(bucket, bool)
        self.wants_logprobs = np.zeros(bucket, bool)
        self.live = np.zeros(bucket, bool)
        self.last_emit = np.zeros(bucket, np.float64)
        self.matchers: list = [None] * bucket
        self.constrained = np.zeros(bucket, bool)
        self.history = np.zeros((bucket, HISTORY_STEPS), np.int32)
        self.emitted = np.zeros((bucket, HISTORY_STEPS), bool)
        self.column = 0
        self.holders: dict = {}

    def resize(self, bucket: int, keep: list[int]) -> None:
        """Fresh arrays for ``bucket`` slots; the entry in slot keep[i] moves to slot i with
        its last token and emit time (the engine's ``resize(keep, bucket)`` does the same)."""
        self.sync()
        entries, tokens, last_emit = self.entries, self.tokens, self.last_emit
        self._fresh(bucket)
        for i, s in enumerate(keep):
            self.place(entries[s], i, int(tokens[s]))
            self.last_emit[i] = last_emit[s]

    def place(self, entry, slot: int, last_token: int) -> None:
        """Put ``entry`` (its params and tokens so far) into free ``slot``."""
        p = entry.params
        entry.slot = slot
        self.entries[slot] = entry
        self.ids[slot] = entry.id
        self.token_lists[slot] = entry.tokens
        self.holders[entry.id] = entry
        self.live[slot] = True
        self.tokens[slot] = last_token
        self.last_emit[slot] = entry.last_emit
        self.positions[slot] = len(entry.tokens)
        self.remaining[slot] = p.max_tokens - len(entry.tokens)
        if len(p.stop_tokens) > self.stops.shape[1]:
            pad = np.full((len(self.stops), len(p.stop_tokens) - self.stops.shape[1]), NO_TOKEN, np.int32)
            self.stops = np.concatenate([self.stops, pad], axis=1)
        self.stops[slot] = NO_TOKEN
        self.stops[slot, :len(p.stop_tokens)] = p.stop_tokens
        self.has_stop_str[slot] = bool(p.stop)
        self.wants_logprobs[slot] = p.logprobs is not None
        self.matchers[slot] = entry.matcher
        self.constrained[slot] = entry.matcher is not None

    def settle(self, entry) -> None:
        """Append ``entry``'s waiting tokens to ``entry.tokens`` (it keeps its slot)."""
        slot, n = entry.slot, self.column
        entry.tokens.extend(self.history[slot, :n][self.emitted[slot, :n]].tolist())
        self.emitted[slot] = False

    def remove(self, entry) -> None:
        """Free ``entry``'s slot (settled first)."""
        self.settle(entry)
        self.entries[entry.slot] = None
        self.ids[entry.slot] = self.token_lists[entry.slot] = None
        self.live[entry.slot] = False
        self.matchers[entry.slot] = None
        self.constrained[entry.slot] = False
        self.wants_logprobs[entry.slot] = self.has_stop_str[entry.slot] = False
        del self.holders[entry.id]
        entry.slot = -1

    def free_slots(self) -> list[int]:
        return np.flatnonzero(~self.live).tolist()

    def live_slots(self) -> list[int]:
        """The live rows' slots, ascending (the order ``resize`` keeps them in)."""
        return sorted(e.slot for e in self.holders.values())

    def steps_left(self) -> int:
        """The most tokens any live row may still draw."""
        return int(self.remaining[self.live].max(initial=0))

    def any_wants_logprobs(self) -> bool:
        return bool(self.wants_logprobs.any())

    def advance(self, out: np.ndarray, nonfinite_token: int, now: float) -> Drawn:
        """Take one step's drawn tokens ``out`` int [B]: keep the emitted ones (``history``)
        and count them, move every position on, feed them back as the next step's tokens
        (negative ones as 0)."""
        nonfinite = out == nonfinite_token
        if self.stops.shape[1] == 1:
            stop_hit = out == self.stops[:, 0]
        else:
            stop_hit = (out[:, None] == self.stops).any(axis=1)
        emit = self.live & ~(nonfinite | stop_hit)
        self.remaining -= emit
        self.positions += 1
        self.tokens = np.maximum(out, 0).astype(np.int32, copy=False)
        gaps = now - self.last_emit[emit]
        self.last_emit[emit] = now
        if self.column == HISTORY_STEPS:
            self.sync()
        self.history[:, self.column] = out
        self.emitted[:, self.column] = emit
        self.column += 1
        return Drawn(emit, nonfinite, stop_hit, gaps)

    def sync(self) -> None:
        """Append every row's waiting tokens to its holder's ``tokens`` and empty the window."""
        n = self.column
        if n == 0:
            return
        emitted = self.emitted[:, :n]
        counts = emitted.sum(axis=1)
        rows = np.flatnonzero(counts)
        if len(rows):
            flat = self.history[:, :n][emitted].tolist()  # row-major: each row's tokens in order
            ends = np.cumsum(counts[rows]).tolist()
            starts = [0] + ends[:-1]
            each(list.extend, self.token_lists[rows], map(flat.__getitem__, map(slice, starts, ends)))
        emitted[:] = False
        self.column = 0
