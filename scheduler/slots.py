"""The decode batch's host side: which request holds each slot of the bucket, and the
per-slot arrays a step reads and updates. The one place a request moves into the batch
(``place``), within it (``resize``: compaction to the front on a bucket change) and out of
it (``remove``)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

NO_TOKEN = -2
"""Padding in the per-slot stop-token table (no drawn token equals it)."""


class Drawn(NamedTuple):
    """One step's drawn tokens sorted out per slot ([bucket] bool each; ``gaps``: seconds
    since each emitting slot's previous token, in slot order)."""
    emit: np.ndarray       # a live row emitted its token (not a stop token, not non-finite)
    nonfinite: np.ndarray  # the row's logits were not finite
    stop_hit: np.ndarray   # the token is one of the row's stop tokens
    gaps: np.ndarray       # float64 [emit.sum()]


class SlotTable:
    """Per slot of a bucket of B slots: ``entries`` (the holder or None), ``tokens`` int32 [B]
    (last drawn token, fed to the next step), ``positions`` int32 [B], ``remaining`` int64 [B]
    (tokens the row may still draw), ``stops`` int32 [B, S] (its stop tokens padded with
    NO_TOKEN), ``has_stop_str``, ``wants_logprobs``, ``live`` bool [B], ``last_emit`` float64
    [B] (perf_counter of its newest token), ``matchers`` (the holder's grammar Matcher or None)
    and ``constrained`` bool [B] (it has one). ``holders``: {request id: entry} of the live rows."""

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
        self.holders: dict = {}

    def resize(self, bucket: int, keep: list[int]) -> None:
        """Fresh arrays for ``bucket`` slots; the entry in slot keep[i] moves to slot i with
        its last token and emit time (the engine's ``resize(keep, bucket)`` does the same)."""
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

    def remove(self, entry) -> None:
        """Free ``entry``'s slot."""
        self.entries[entry.slot] = None
        self.live[entry.slot] = False
        self.matchers[entry.slot] = None
        self.constrained[entry.slot] = False
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
        return bool((self.wants_logprobs & self.live).any())

    def advance(self, out: np.ndarray, nonfinite_token: int, now: float) -> Drawn:
        """Take one step's drawn tokens ``out`` int [B]: count the emitted ones, move every
        position on, feed them back as the next step's tokens (negative ones as 0)."""
        nonfinite = out == nonfinite_token
        stop_hit = (out[:, None] == self.stops).any(axis=1)
        emit = self.live & ~nonfinite & ~stop_hit
        self.remaining -= emit
        self.positions += 1
        self.tokens = np.where(out < 0, 0, out).astype(np.int32)
        emitted = np.flatnonzero(emit)
        gaps = now - self.last_emit[emitted]
        self.last_emit[emitted] = now
        return Drawn(emit, nonfinite, stop_hit, gaps)
