"""Prefill policies: which prompt tokens run in the next prefill call (numpy only).

- SERIAL: one whole prompt per call (B=1, T=n) in the prefill worker, beside decode.
- VARLEN: in the prefill worker, beside decode, one call takes up to `chunk` prompt
  tokens from one or more waiting prompts, flattened without padding
  (`Engine.prefill_varlen`); a prompt cut at the budget continues from its carried
  state in the next call.
- MIXED: no worker; a decode step also carries up to `chunk` prompt tokens, picked the
  same way (`Engine.mixed_step`), so prefill never stalls decode for more than a chunk.

`plan_pieces` is the planner (it sees only remaining prompt lengths); `PiecewisePrefill`
runs VARLEN calls and MIXED steps for the scheduler and hands back finished prompts with
their first token drawn, exactly as serial prefill does. `varlen_shape` buckets a
flattened call's token rows so that engines compile few shapes.

Engines that support the two policies implement, besides the `Engine` protocol:
``prefill_varlen(prompts, starts, token_rows) -> rows`` and
``mixed_step(tokens, positions, prompts, starts, token_rows) -> (drawn, rows)``
(prompts: int arrays [T_i >= 1], at most MAX_PIECES; starts: a Row or None each;
token_rows: the flat token count to pad to, always `varlen_shape(chunk)` here so each
call compiles once (per bucket); one Row per piece comes back; see
rwkv_jax/varlen_engine.py).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Sequence

import numpy as np

from .config import PrefillPolicy
from .stats import PrefillRecord

MAX_PIECES = 8
"""Most prompts one flattened call carries (its sequence rows are padded to this)."""


def plan_pieces(remaining: Sequence[int], budget: int, max_pieces: int = MAX_PIECES) -> list[int]:
    """Tokens the next flattened call takes from each head-of-queue prompt: `budget`
    tokens filled first-come first-served over at most `max_pieces` prompts, the last
    one possibly cut. `remaining`: tokens left per waiting prompt, in queue order (each
    >= 1). Returns one count (>= 1) per prompt taken, in order."""
    if budget < 1 or max_pieces < 1:
        raise ValueError(f"plan_pieces needs budget >= 1 and max_pieces >= 1, got {budget}, {max_pieces}")
    counts: list[int] = []
    left = budget
    for n in remaining:
        if left == 0 or len(counts) == max_pieces:
            break
        if n < 1:
            raise ValueError(f"a waiting prompt has {n} tokens left; every piece needs >= 1")
        counts.append(min(n, left))
        left -= counts[-1]
    return counts


def varlen_shape(n_tokens: int, min_tokens: int = 16) -> int:
    """Token rows a flattened call of `n_tokens` compiles for: the next power of two, at
    least `min_tokens`. Calls filled to a power-of-two budget waste nothing."""
    if n_tokens < 1:
        raise ValueError(f"varlen_shape needs n_tokens >= 1, got {n_tokens}")
    return max(min_tokens, 1 << (n_tokens - 1).bit_length())


def check_engine_supports(engine, policy: PrefillPolicy) -> None:
    """ValueError when `engine` lacks the method `policy` needs."""
    needs = {PrefillPolicy.VARLEN: "prefill_varlen", PrefillPolicy.MIXED: "mixed_step"}.get(policy)
    if needs is not None and not callable(getattr(engine, needs, None)):
        raise ValueError(f"prefill policy {policy.value!r} needs an engine with {needs}(); "
                         f"{type(engine).__name__} supports only 'serial'")


class _Progress:
    """One prompt being prefilled in pieces: its first `done` tokens are in `row`."""
    __slots__ = ("entry", "done", "row", "start_time", "looked_up")

    def __init__(self, entry):
        self.entry, self.done, self.row, self.looked_up = entry, 0, None, False
        self.start_time = time.perf_counter()


class PiecewisePrefill:
    """VARLEN calls and MIXED steps over the prompts in progress (first come, first served).

    Entries are the scheduler's request records: read `id`, `prompt` (list of ints),
    `params`; written like serial prefill does: `row`, `first_token`, `first_token_time`,
    `cached_tokens`, `prefill_seconds`, `error`. Finished (or failed) entries collect in
    `completed` for the scheduler to take. Stats get one PrefillRecord per piece; a
    call's seconds are shared among its pieces by token count (in a mixed step the decode
    rows count as one token each, so only the pieces' share counts as prefill).

    With a prefix cache, as in serial prefill: a prompt's longest cached prefix is looked
    up when its first piece is planned (so a twin that finished meanwhile is a hit), its
    state at the last multiple of `prefix_block` tokens is cached (pieces are cut there),
    and so is its whole-prompt state.
    """

    def __init__(self, engine, budget: int, stats, prefix_cache=None, prefix_block: int = 64):
        self.engine, self.budget, self.stats, self.cache = engine, budget, stats, prefix_cache
        self.prefix_block = prefix_block
        self.token_rows = varlen_shape(budget)
        self.queue: deque[_Progress] = deque()
        self.completed: list = []

    def __len__(self) -> int:
        return len(self.queue)

    def pending_tokens(self) -> int:
        return sum(len(p.entry.prompt) - p.done for p in self.queue)

    def add(self, entry) -> None:
        """Queue an entry (its prompt runs from the longest cached prefix)."""
        self.queue.append(_Progress(entry))

    def _look_up(self, progress: _Progress) -> None:
        entry = progress.entry
        progress.looked_up = True
        progress.done, host = self.cache.longest_prefix(entry.prompt)
        if progress.done:
            self.stats.prefix_hits += 1
            progress.row = self.engine.from_host(host)
        else:
            self.stats.prefix_misses += 1
        entry.cached_tokens = progress.done
        if progress.done == len(entry.prompt):  # the whole prompt was cached, logits too
            self.queue.remove(progress)
            self._complete(progress)

    def _boundary(self, progress: _Progress) -> int:
        """The block boundary whose state gets cached (0 without a cache)."""
        if self.cache is None:
            return 0
        return (len(progress.entry.prompt) - 1) // self.prefix_block * self.prefix_block

    def run_varlen(self) -> None:
        """One VARLEN call over the head of the queue."""
        taken, prompts, starts = self._take()
        if not taken:  # every queued prompt was served whole by the prefix cache
            return
        start = time.perf_counter()
        try:
            rows = self.engine.prefill_varlen(prompts, starts, self.token_rows)
        except Exception as e:  # those prompts fail; the queue goes on
            self._fail(taken, f"prefill failed: {type(e).__name__}: {e}")
            return
        self._advance(taken, rows, start, time.perf_counter() - start, extra_rows=0)

    def mixed_step(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """`Engine.step` plus a chunk from the head of the queue; returns the drawn tokens.
        On an engine error the pieces' prompts fail and the error propagates."""
        taken, prompts, starts = self._take()
        if not taken:
            return self.engine.step(tokens, positions)
        start = time.perf_counter()
        try:
            drawn, rows = self.engine.mixed_step(tokens, positions, prompts, starts, self.token_rows)
        except Exception as e:
            self._fail(taken, f"engine step failed: {type(e).__name__}: {e}")
            raise
        self._advance(taken, rows, start, time.perf_counter() - start, extra_rows=len(tokens))
        return drawn

    def _take(self):
        if self.cache is not None:
            for progress in [p for p in self.queue if not p.looked_up]:
                self._look_up(progress)
        remaining = []
        for p in self.queue:  # a piece stops at the cached block boundary
            boundary = self._boundary(p)
            remaining.append((boundary if p.done < boundary else len(p.entry.prompt)) - p.done)
        counts = plan_pieces(remaining, self.budget)
        taken = [(p, n) for p, n in zip(self.queue, counts)]
        prompts = [np.asarray(p.entry.prompt[p.done:p.done + n], np.int32) for p, n in taken]
        return taken, prompts, [p.row for p, _ in taken]

    def _advance(self, taken, rows, start: float, seconds: float, extra_rows: int) -> None:
        total = sum(n for _, n in taken) + extra_rows
        for (progress, n), row in zip(taken, rows):
            entry = progress.entry
            progress.done += n
            progress.row = row
            self.stats.prefills.append(PrefillRecord(start, entry.id, n, seconds * n / total))
            if progress.done == self._boundary(progress) > 0:
                self.cache.put(entry.prompt[:progress.done], self.engine.to_host(row))
            if progress.done == len(entry.prompt):
                self.queue.remove(progress)
                if self.cache is not None:
                    self.cache.put(entry.prompt, self.engine.to_host(row))
                self._complete(progress)

    def _complete(self, progress: _Progress) -> None:
        """Draw the first token from the finished row and hand the entry over."""
        entry = progress.entry
        entry.row = progress.row
        entry.first_token = int(self.engine.sample(progress.row, entry.params, 0))
        entry.first_token_time = now = time.perf_counter()
        entry.prefill_seconds = now - progress.start_time
        self.completed.append(entry)

    def _fail(self, taken, message: str) -> None:
        for progress, _ in taken:
            self.queue.remove(progress)
            progress.entry.error = message
            progress.entry.row = None
            self.completed.append(progress.entry)
