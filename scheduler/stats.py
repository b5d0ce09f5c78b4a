"""Structured run statistics: per step, per request, compiles, bucket switches, prefix cache."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class StepRecord(NamedTuple):
    time: float      # perf_counter at the start of the step
    bucket: int
    live: int        # rows holding a request
    path: str        # engine kernel path of the step
    seconds: float   # engine.step wall time (includes fetching the sampled tokens)


class RequestRecord(NamedTuple):
    id: str
    prompt_tokens: int
    cached_tokens: int          # prompt tokens served by the prefix cache
    prefill_seconds: float | None
    ttft: float | None          # first token time - arrival time
    generated_tokens: int
    finish_reason: str
    arrival_time: float
    finish_time: float


class CompileEvent(NamedTuple):
    time: float
    bucket: int
    seconds: float


class BucketSwitch(NamedTuple):
    time: float
    from_bucket: int
    to_bucket: int
    live: int
    seconds: float   # engine.resize wall time


class PrefillRecord(NamedTuple):
    time: float
    id: str
    tokens: int      # tokens actually run (prompt minus cached prefix)
    seconds: float


@dataclass
class Stats:
    """Everything a run records; append-only lists of the records above. ``to_dict()`` is
    JSON-able (records become dicts)."""
    steps: list[StepRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    compiles: list[CompileEvent] = field(default_factory=list)
    switches: list[BucketSwitch] = field(default_factory=list)
    prefills: list[PrefillRecord] = field(default_factory=list)
    prefix_hits: int = 0
    prefix_misses: int = 0

    @property
    def prefix_hit_rate(self) -> float | None:
        n = self.prefix_hits + self.prefix_misses
        return self.prefix_hits / n if n else None

    def to_dict(self) -> dict:
        def rows(records):
            return [r._asdict() for r in records]
        return {"steps": rows(self.steps), "requests": rows(self.requests),
                "compiles": rows(self.compiles), "switches": rows(self.switches),
                "prefills": rows(self.prefills),
                "prefix_cache": {"hits": self.prefix_hits, "misses": self.prefix_misses,
                                 "hit_rate": self.prefix_hit_rate}}
