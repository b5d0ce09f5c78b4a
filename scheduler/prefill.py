"""Prefill policies: which prompt tokens run in the next prefill call (numpy only).

One mechanism serves every policy: ``Prefill`` keeps the prompts in progress (first come,
first served), plans the next call's pieces, runs it and hands back finished prompts with
their first token drawn. The policies differ only in how much a call takes and where it
runs:

- SERIAL: one prompt per call (``Engine.prefill``, B=1), in the prefill worker beside decode;
  a prompt longer than SERIAL_CALL_TOKENS runs in several calls, each from the last one's row.
- VARLEN: up to ``chunk`` tokens from up to MAX_PIECES prompts flattened without padding
  (``VarlenPrefill.prefill_varlen``, needs ``Capability.VARLEN_PREFILL``), in the worker
  beside decode; a prompt cut at the budget continues from its carried state in the next call.
- AUTO: per call, VARLEN's call when several queued prompts fit in it (so a prompt-heavy
  job keeps its batch full), else SERIAL's: the head prompt whole at B=1 (one waiting
  prompt, or one long enough to fill the chunk by itself, gains nothing from flattening);
  SERIAL throughout on an engine without ``Capability.VARLEN_PREFILL``.
- MIXED: no worker; each decode step also carries up to ``chunk`` prompt tokens planned
  the same way (``MixedStep.mixed_step``, needs ``Capability.MIXED_STEP``), so prefill never
  stalls decode for more than a chunk.

With a prefix cache every policy looks a prompt's longest cached prefix up when its first
piece is planned, cuts a piece at the last multiple of ``prefix_block`` tokens and caches
the state there, and caches the whole prompt's state; a prompt whose first block equals
that of an earlier queued prompt still computing its boundary state waits for it (and hits).
A request with an initial state runs
from it (``Engine.from_host``); its cache keys live in that state's namespace. A prompt
that drew a non-finite first token from a cached prefix drops that entry (memory and disk)
and runs again without the cache; an unreadable disk entry is removed at lookup. With
``turn_cache`` the step loop also keeps each finished request's final state (``keep_final``),
keyed by the prompt plus the tokens it consumed: such a state has no logits, so a prompt
equal to its key looks up one token shorter (the logits come from running that token).
Calls are bounded, so whoever drives them can stop between two (``abandon``): a stop signal
is honoured within one call however long the prompt.
"""
from __future__ import annotations

import hashlib
import time
from collections import deque
from typing import Any, NamedTuple, Sequence

import numpy as np

from rwkv7_core.engine import MAX_PIECES, Capability, varlen_shape
from rwkv7_core.sampling import NONFINITE_TOKEN

from .config import PrefillPolicy
from .stats import PrefillRecord

SERIAL_CALL_TOKENS = 8192
"""Most prompt tokens of one SERIAL call (a multiple of every engine's largest prefill piece,
so cutting there runs the same pieces): a long prompt takes several calls, between which
the worker sees a stop."""

CAPABILITY = {PrefillPolicy.VARLEN: Capability.VARLEN_PREFILL, PrefillPolicy.MIXED: Capability.MIXED_STEP}
"""The engine capability each policy needs beyond the Engine contract."""


def plan_pieces(remaining: Sequence[int], budget: int, max_pieces: int = MAX_PIECES) -> list[int]:
    """Tokens the next call takes from each head-of-queue prompt: `budget` tokens filled
    first-come first-served over at most `max_pieces` prompts, the last one possibly cut.
    `remaining`: tokens left per queued prompt, in queue order (each >= 1). Returns one
    count (>= 1) per prompt taken, in order."""
    if budget < 1 or max_pieces < 1:
        raise ValueError(f"plan_pieces needs budget >= 1 and max_pieces >= 1, got {budget}, {max_pieces}")
    counts: list[int] = []
    left = budget
    for n in remaining:
        if left == 0 or len(counts) == max_pieces:
            break
        if n < 1:
            raise ValueError(f"a queued prompt has {n} tokens left; every piece needs >= 1")
        counts.append(min(n, left))
        left -= counts[-1]
    return counts


def check_engine_supports(engine, policy: PrefillPolicy) -> None:
    """ValueError when ``engine`` lacks the capability ``policy`` needs."""
    needs = CAPABILITY.get(policy)
    if needs is not None and needs not in engine.capabilities:
        raise ValueError(f"prefill policy {policy.value!r} needs an engine with {needs}; "
                         f"{type(engine).__name__} does not declare it")


def _lacks_logits(host_row) -> bool:
    """Whether a host row has no logits (engines put them last, None for a row taken from
    the decode batch: ``Engine.extract``)."""
    return bool(host_row) and host_row[-1] is None


def draw_first(engine, row, entry) -> int:
    """The first token of ``entry`` (its params; its grammar matcher's mask, if any) from a
    prefilled row."""
    if entry.matcher is None:
        return int(engine.sample(row, entry.params, 0))
    return int(engine.sample(row, entry.params, 0, allowed=entry.matcher.mask(engine.vocab_size)))


def _namespace(entry) -> str:
    """The prefix-cache namespace of an entry: its initial state's key ("" = zeros), and its
    request's ``cache_salt`` (hashed: a disk entry never holds the secret) after a separator no
    state key holds."""
    state = "" if entry.initial is None else entry.initial.key
    salt = entry.request.cache_salt
    return state if not salt else f"{state}\0salt:{hashlib.sha256(salt.encode()).hexdigest()}"


class Prefilled(NamedTuple):
    """A prompt that left the prefill queue: its row and first token, or the error."""
    entry: Any                       # the scheduler's record it was queued with
    row: Any                         # the engine row after the prompt (None on error)
    first_token: int | None
    first_token_time: float | None   # perf_counter
    cached_tokens: int               # prompt tokens served by the prefix cache
    prefill_seconds: float | None    # queued -> first token
    error: str | None


class PrefillReport(NamedTuple):
    """What one call (or one add) produced: the prompts it finished or failed, the kind of
    engine call that succeeded ("serial", "varlen", "mixed"; None if none did), one
    PrefillRecord per piece run, the prefix-cache lookups made, the cache entries removed
    (unreadable, or non-finite in use) and the prompt tokens the hits served."""
    done: list[Prefilled]
    call: str | None
    pieces: list[PrefillRecord]
    hits: int
    misses: int
    removed: int = 0
    hit_tokens: int = 0


class PiecesFailed(Exception):
    """A mixed step failed: ``report`` holds its pieces' prompts, failed."""

    def __init__(self, report: PrefillReport):
        super().__init__(report.done[0].error if report.done else "mixed step failed")
        self.report = report


class _Progress:
    """One prompt being prefilled in pieces: its first `done` tokens are in `row`."""
    __slots__ = ("entry", "done", "row", "start_time", "looked_up", "cached")

    def __init__(self, entry):
        self.entry, self.done, self.row, self.looked_up, self.cached = entry, 0, None, False, 0
        self.start_time = time.perf_counter()


class Prefill:
    """The prompts in progress and the calls that advance them (see the module docstring).

    Queued entries are the scheduler's request records, read only: ``id``, ``prompt`` (list
    of ints), ``params``, ``initial`` (an InitialState or None), ``matcher`` (its grammar
    Matcher or None: the first token is drawn under its mask). Each call returns a
    PrefillReport of what it produced. ``clock``: the ``start_call`` / ``call_seconds`` pair
    of ``scheduler.stats.Stats`` (compiles excluded); a call's seconds are shared among its
    pieces by token count (in a mixed step the decode rows count as one token each, so only
    the pieces' share counts as prefill).
    """

    def __init__(self, engine, policy: PrefillPolicy, chunk: int, clock, prefix_cache=None,
                 prefix_block: int = 64, turn_cache: bool = False):
        if policy is PrefillPolicy.AUTO and Capability.VARLEN_PREFILL not in engine.capabilities:
            policy = PrefillPolicy.SERIAL
        self.engine, self.policy, self.clock, self.cache = engine, policy, clock, prefix_cache
        self.prefix_block, self.turn_cache = prefix_block, turn_cache
        serial = policy is PrefillPolicy.SERIAL
        self.budget = None if serial else chunk
        self.max_pieces = 1 if serial else MAX_PIECES
        self.token_rows = None if serial else varlen_shape(chunk)
        self.queue: deque[_Progress] = deque()
        self._done: list[Prefilled] = []
        self._pieces: list[PrefillRecord] = []
        self._lookups = [0, 0, 0, 0]  # hits, misses, entries removed, tokens hit

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def keeps_turns(self) -> bool:
        """Whether finished requests' final states go into the prefix cache (``keep_final``)."""
        return self.cache is not None and self.turn_cache

    def keep_final(self, entry, consumed: Sequence[int], host_row) -> None:
        """Cache ``host_row`` (a finished request's state, no logits) under the prompt plus
        ``consumed``: exactly the generated tokens that state has run through."""
        self.cache.put(list(entry.prompt) + list(consumed), host_row, _namespace(entry))

    def wants_more(self) -> bool:
        """Whether another prompt should join the queue: SERIAL takes one at a time, the
        others keep less than a call's worth of tokens queued (so few batch rows are
        reserved for prompts still in prefill)."""
        if self.budget is None:
            return not self.queue
        return sum(len(p.entry.prompt) - p.done for p in self.queue) < self.budget

    def precompile(self, buckets) -> dict[str, float]:
        """Compile ahead of time what this policy's calls run (the prefill pieces and
        first-token sampling; the flattened shape for VARLEN/AUTO; the mixed step per
        bucket for MIXED); {what: seconds}."""
        seconds = {f"prefill:{n}": s for n, s in self.engine.compile_prefill().items()}
        if self.policy in (PrefillPolicy.VARLEN, PrefillPolicy.AUTO):
            seconds[f"varlen_prefill:{self.token_rows}"] = self.engine.compile_varlen(self.token_rows)
        if self.policy is PrefillPolicy.MIXED:
            for b in buckets:
                seconds[f"mixed:({b}, {self.token_rows})"] = self.engine.compile_mixed(b, self.token_rows)
        return seconds

    def add(self, entry) -> Prefilled | None:
        """Queue an entry (its prompt runs from the longest cached prefix, else from its
        initial state); the failure when its initial state does not load."""
        progress = _Progress(entry)
        if entry.initial is not None:
            try:
                progress.row = self.engine.from_host(entry.initial.row)
            except Exception as e:
                return Prefilled(entry, None, None, None, 0, None, f"bad initial state: {type(e).__name__}: {e}")
        self.queue.append(progress)
        return None

    def abandon(self) -> list:
        """Drop every prompt in progress (its work so far is lost); their entries."""
        entries = [p.entry for p in self.queue]
        self.queue.clear()
        return entries

    def run(self) -> PrefillReport:
        """One prefill call (SERIAL, VARLEN or AUTO) over the head of the queue."""
        taken, prompts, starts = self._take()
        serial = len(taken) == 1 and self.policy is not PrefillPolicy.VARLEN
        if not taken:  # every queued prompt was served whole by the prefix cache
            return self._report(None)
        clock = self.clock.start_call()
        try:
            if serial:
                rows = [self.engine.prefill(prompts[0], starts[0])]
            else:
                rows = self.engine.prefill_varlen(prompts, starts, self.token_rows)
        except Exception as e:  # those prompts fail; the queue goes on
            self._fail(taken, f"prefill failed: {type(e).__name__}: {e}")
            return self._report(None)
        self._advance(taken, rows, clock[1], self.clock.call_seconds(clock), extra_rows=0)
        return self._report((PrefillPolicy.SERIAL if serial else PrefillPolicy.VARLEN).value)

    def mixed_step(self, tokens: np.ndarray, positions: np.ndarray, **masks) -> tuple[np.ndarray, PrefillReport]:
        """MIXED: ``Engine.step`` plus a chunk from the head of the queue; the drawn tokens
        and the report (``masks``: ``allowed=`` packed token masks, when a row is constrained).
        On an engine error: PiecesFailed (the pieces' prompts failed), from it."""
        taken, prompts, starts = self._take()
        if not taken:
            return self.engine.step(tokens, positions, **masks), self._report(None)
        clock = self.clock.start_call()
        try:
            drawn, rows = self.engine.mixed_step(tokens, positions, prompts, starts, self.token_rows, **masks)
        except Exception as e:
            self._fail(taken, f"engine step failed: {type(e).__name__}: {e}")
            raise PiecesFailed(self._report(None)) from e
        self._advance(taken, rows, clock[1], self.clock.call_seconds(clock), extra_rows=len(tokens))
        return drawn, self._report(PrefillPolicy.MIXED.value)

    def _report(self, call: str | None) -> PrefillReport:
        report = PrefillReport(self._done, call, self._pieces, *self._lookups)
        self._done, self._pieces, self._lookups = [], [], [0, 0, 0, 0]
        return report

    # -- planning ------------------------------------------------------------------------
    def _look_up(self, progress: _Progress) -> None:
        entry = progress.entry
        progress.looked_up = True
        progress.done, host = self.cache.longest_prefix(entry.prompt, _namespace(entry))
        if progress.done == len(entry.prompt) and _lacks_logits(host):  # a finished request's state
            progress.done, host = self.cache.longest_prefix(entry.prompt[:-1], _namespace(entry))
        self._lookups[0 if progress.done else 1] += 1
        self._lookups[2] += self.cache.take_removed()
        self._lookups[3] += progress.done
        if progress.done:
            progress.row = self.engine.from_host(host)
        progress.cached = progress.done
        if progress.done == len(entry.prompt):  # the whole prompt was cached, logits too
            self.queue.remove(progress)
            self._complete(progress)

    def _boundary(self, progress: _Progress) -> int:
        """The block boundary whose state gets cached (0 without a cache)."""
        if self.cache is None:
            return 0
        return (len(progress.entry.prompt) - 1) // self.prefix_block * self.prefix_block

    def _ready_to_run(self) -> list[_Progress]:
        """The queue, prefix-cache lookups done, less the prompts that wait for an earlier
        queued prompt with the same first block to cache its boundary state (so prompts
        sharing a system prompt that arrive together compute it once, then hit)."""
        if self.cache is None:
            return list(self.queue)
        ready, computing = [], set()
        for progress in list(self.queue):
            first_block = (_namespace(progress.entry), tuple(progress.entry.prompt[:self.prefix_block]))
            if not progress.looked_up:
                if first_block in computing:
                    continue
                self._look_up(progress)
                if progress not in self.queue:  # served whole from the cache
                    continue
            if progress.done < self._boundary(progress):
                computing.add(first_block)
            ready.append(progress)
        return ready

    def _take(self):
        """The next call's pieces: SERIAL one whole prompt (at most SERIAL_CALL_TOKENS of it),
        VARLEN the budget, AUTO the budget when that takes several prompts and else SERIAL's."""
        ready = self._ready_to_run()
        remaining = []
        for p in ready:  # a piece stops at the cached block boundary
            boundary = self._boundary(p)
            remaining.append((boundary if p.done < boundary else len(p.entry.prompt)) - p.done)
        counts = [] if self.budget is None else plan_pieces(remaining, self.budget, self.max_pieces)
        if self.policy is PrefillPolicy.SERIAL or (self.policy is PrefillPolicy.AUTO and len(counts) < 2):
            counts = plan_pieces(remaining, min(max(remaining, default=1), SERIAL_CALL_TOKENS), 1)
        taken = list(zip(ready, counts))
        prompts = [np.asarray(p.entry.prompt[p.done:p.done + n], np.int32) for p, n in taken]
        return taken, prompts, [p.row for p, _ in taken]

    # -- results -------------------------------------------------------------------------
    def _advance(self, taken, rows, start: float, seconds: float, extra_rows: int) -> None:
        total = sum(n for _, n in taken) + extra_rows
        for (progress, n), row in zip(taken, rows):
            entry = progress.entry
            progress.done += n
            progress.row = row
            self._pieces.append(PrefillRecord(start, entry.id, n, seconds * n / total))
            if progress.done == self._boundary(progress) > 0:
                self.cache.put(entry.prompt[:progress.done], self.engine.to_host(row), _namespace(entry))
            if progress.done == len(entry.prompt):
                self.queue.remove(progress)
                if self.cache is not None:
                    self.cache.put(entry.prompt, self.engine.to_host(row), _namespace(entry))
                self._complete(progress)

    def _complete(self, progress: _Progress) -> None:
        """Draw the first token from the finished row (a non-finite one drawn after a cached
        prefix drops that entry and queues the prompt again, to run without the cache)."""
        entry = progress.entry
        first = draw_first(self.engine, progress.row, entry)
        if first == NONFINITE_TOKEN and progress.cached:
            self.cache.drop(entry.prompt[:progress.cached], _namespace(entry))
            self._lookups[2] += self.cache.take_removed()
            progress.done = progress.cached = 0
            progress.row = None if entry.initial is None else self.engine.from_host(entry.initial.row)
            self.queue.appendleft(progress)
            return
        now = time.perf_counter()
        self._done.append(Prefilled(entry, progress.row, first, now, progress.cached, now - progress.start_time,
                                    None))

    def _fail(self, taken, message: str) -> None:
        for progress, _ in taken:
            self.queue.remove(progress)
            self._done.append(Prefilled(progress.entry, None, None, None, progress.cached, None, message))
