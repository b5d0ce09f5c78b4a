"""Scheduler configuration (immutable), the bucket ladder and the choice of a step's bucket."""
from __future__ import annotations

import enum
from typing import Callable, NamedTuple, Sequence

from rwkv7_core.sampling import DEVICE_INT_MAX, MAX_TOKENS_LIMIT


class PrefillPolicy(str, enum.Enum):
    """How prompts are prefilled (scheduler/prefill.py). SERIAL: one prompt per call in a
    worker thread while decode steps keep running; VARLEN: flattened pieces of several
    prompts per call in that worker; AUTO (the default): per call, SERIAL when one prompt
    waits and VARLEN when several do (SERIAL on engines without
    Capability.VARLEN_PREFILL); MIXED: prompt pieces inside the decode steps."""
    AUTO = "auto"
    SERIAL = "serial"
    VARLEN = "varlen"
    MIXED = "mixed"


class SchedulerConfig(NamedTuple):
    """max_batch: most live rows; buckets: decode batch sizes (default powers of two up to
    max_batch, max_batch itself included); prefix_cache_bytes: host prefix-state cache bound
    (0 = off); prefix_block: besides whole prompts, the state at the last multiple of this many
    tokens is cached, so prompts sharing a system prompt hit; turn_cache: with a prefix cache,
    also keep each finished request's final state, keyed by the prompt plus the tokens that
    state has consumed, so the next prompt extending it (a chat's next turn) prefills only what
    is new; precompile: compile every bucket, the prefill shapes of the policy and the logprob
    paths before the first step; prefill_policy: a PrefillPolicy (or its value; ``validated``
    makes it the member); chunk: prompt tokens per varlen call or mixed step; stats_records:
    how many of the most recent per-step / per-request / per-prefill records ``Stats`` keeps
    (its totals and percentiles cover every request whatever this is); max_tokens_limit: the
    most ``max_tokens`` a request may ask for (``--max-tokens-limit``; a larger one fails alone)."""
    max_batch: int = 256
    buckets: Sequence[int] | None = None
    prefix_cache_bytes: int = 0
    prefix_block: int = 64
    turn_cache: bool = True
    precompile: bool = False
    prefill_policy: PrefillPolicy | str = PrefillPolicy.AUTO
    chunk: int = 256
    stats_records: int = 10_000
    max_tokens_limit: int = MAX_TOKENS_LIMIT

    def validated(self) -> "SchedulerConfig":
        """Return a copy with ``buckets`` resolved to a sorted tuple; ValueError on bad fields."""
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"SchedulerConfig.max_batch={self.max_batch!r}: must be an integer >= 1")
        buckets = bucket_ladder(self.max_batch) if self.buckets is None else tuple(sorted(set(self.buckets)))
        if not buckets or any(not isinstance(b, int) or b < 1 for b in buckets):
            raise ValueError(f"SchedulerConfig.buckets={self.buckets!r}: must be positive integers")
        if buckets[-1] < self.max_batch:
            raise ValueError(f"SchedulerConfig.buckets={self.buckets!r}: largest bucket is below "
                             f"max_batch={self.max_batch}")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"SchedulerConfig.prefix_cache_bytes={self.prefix_cache_bytes!r}: must be >= 0")
        if self.prefix_block < 1:
            raise ValueError(f"SchedulerConfig.prefix_block={self.prefix_block!r}: must be >= 1")
        if not isinstance(self.stats_records, int) or self.stats_records < 0:
            raise ValueError(f"SchedulerConfig.stats_records={self.stats_records!r}: must be an integer >= 0")
        if not isinstance(self.max_tokens_limit, int) or not 1 <= self.max_tokens_limit <= DEVICE_INT_MAX:
            raise ValueError(f"SchedulerConfig.max_tokens_limit={self.max_tokens_limit!r}: must be an integer "
                             f"in [1, {DEVICE_INT_MAX}]")
        if self.chunk < 1:
            raise ValueError(f"SchedulerConfig.chunk={self.chunk!r}: must be >= 1")
        try:
            policy = PrefillPolicy(self.prefill_policy)
        except ValueError:
            raise ValueError(f"SchedulerConfig.prefill_policy={self.prefill_policy!r}: choose one of "
                             f"{[p.value for p in PrefillPolicy]}") from None
        return self._replace(buckets=buckets, prefill_policy=policy)


def bucket_ladder(max_batch: int) -> tuple[int, ...]:
    """Powers of two below max_batch, then max_batch: 256 -> (1, 2, 4, ..., 256); 6 -> (1, 2, 4, 6)."""
    ladder = []
    b = 1
    while b < max_batch:
        ladder.append(b)
        b *= 2
    return tuple(ladder) + (max_batch,)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """Smallest bucket holding n rows (buckets sorted); the largest when none does."""
    for b in buckets:
        if b >= n:
            return b
    return buckets[-1]


def choose_bucket(need: int, want: int, current: int, buckets: Sequence[int],
                  ready: Callable[[int], bool]) -> int:
    """The bucket of the next decode step. ``need``: rows it must hold (live and admitted);
    ``want``: rows it should hold (with the prompts in prefill, which join soon); ``current``:
    the bucket now (0: none); ``ready(b)``: moving to bucket b waits for no compile. The
    smallest bucket holding ``want`` when it is ready; else, shrinking, the smallest ready
    bucket between it and ``current`` (``current`` itself at worst: its rows padded);
    growing, the largest ready bucket below it that holds ``need`` (ready rows wait), else
    the smallest ready one above it; when none is (the first step), the wanted one, compiled
    then."""
    target = bucket_for(want, buckets)
    usable = lambda b: b == current or ready(b)  # noqa: E731
    if usable(target):
        return target
    if target < current:
        return min(b for b in buckets if target < b <= current and usable(b))
    below = [b for b in buckets if need <= b < target and usable(b)]
    if below:
        return max(below)
    return min((b for b in buckets if b > target and usable(b)), default=target)
