"""Per-request types: sampling parameters, the request, its life-cycle state and its result."""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

END_OF_TEXT = 0


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded; applied on the device, row by row.

    Order per generated token: logits (float32) -> banned tokens set to -inf -> penalties
    (``presence_penalty`` once for every token seen so far, ``frequency_penalty`` times its
    decayed count; counts decay by ``penalty_decay`` each step, RWKV style) -> greedy argmax
    when ``temperature == 0``, else divide by temperature -> top-k -> top-p -> draw.
    ``stop_tokens`` end the request and are not emitted (default: end-of-text 0; an explicit
    list replaces the default). ``stop`` strings are matched on decoded text when the
    scheduler has a tokenizer. ``seed`` fixes the draws; the same request and seed give the
    same tokens whatever batch or bucket it runs in.
    """
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_decay: float = 1.0
    banned_tokens: tuple[int, ...] = ()
    stop_tokens: tuple[int, ...] = (END_OF_TEXT,)
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        for name in ("banned_tokens", "stop_tokens", "stop"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise ValueError(f"SamplingParams.{name} must be a list, got {value!r}")
            object.__setattr__(self, name, tuple(value))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SamplingParams":
        """Build from a mapping of field names; an unknown field raises ValueError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling field(s): {', '.join(unknown)}")
        return cls(**d).validate()

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)

    def validate(self, vocab_size: int | None = None) -> "SamplingParams":
        """Return self, or raise ValueError naming the first invalid field."""
        def bad(name, why):
            raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {why}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_real(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_int(self.max_tokens) or self.max_tokens < 0:
            bad("max_tokens", "must be an integer >= 0")
        if not is_real(self.temperature) or self.temperature < 0:
            bad("temperature", "must be a finite number >= 0")
        if not is_real(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must lie in (0, 1]")
        if not is_int(self.top_k) or self.top_k < 0:
            bad("top_k", "must be an integer >= 0 (0 = no top-k)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not is_real(getattr(self, name)):
                bad(name, "must be a finite number")
        if not is_real(self.penalty_decay) or not 0 < self.penalty_decay <= 1:
            bad("penalty_decay", "must lie in (0, 1]")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**32):
            bad("seed", "must be an integer in [0, 2**32) or None")
        for name in ("banned_tokens", "stop_tokens"):
            for t in getattr(self, name):
                if not is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size):
                    bad(name, f"token {t!r} is not an id in [0, {vocab_size or 'vocab_size'})")
        if vocab_size is not None and len(set(self.banned_tokens)) >= vocab_size:
            bad("banned_tokens", "bans every token")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                bad("stop", "stop strings must be non-empty strings")
        return self


@dataclass(frozen=True)
class Request:
    """One prompt to complete. ``prompt_tokens``: token ids (non-empty, each < vocab_size)."""
    id: str
    prompt_tokens: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)


class RequestState(enum.Enum):
    """Life cycle: WAITING -> PREFILL -> READY -> RUNNING -> FINISHED, or FAILED / CANCELLED."""
    WAITING = "waiting"      # added, prefill not started
    PREFILL = "prefill"      # its prompt is being prefilled (worker thread)
    READY = "ready"          # state row and first token exist; joins the batch at the next step
    RUNNING = "running"      # holds a slot in the decode batch
    FINISHED = "finished"    # finish_reason "length" or "stop"
    FAILED = "failed"        # finish_reason "error"; RequestOutput.error says why
    CANCELLED = "cancelled"  # finish_reason "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (RequestState.FINISHED, RequestState.FAILED, RequestState.CANCELLED)


FINISH_REASONS = ("length", "stop", "error", "cancelled")


@dataclass(frozen=True)
class RequestOutput:
    """Result of one request. Times are ``time.perf_counter()`` seconds; ``first_token_time``
    is None when no token was sampled. ``tokens`` excludes the prompt and any stop token; when
    a stop string matched, it ends with the token that completed the match."""
    id: str
    tokens: list[int]
    finish_reason: str
    error: str | None
    prompt_tokens: int
    generated_tokens: int
    arrival_time: float
    first_token_time: float | None
    finish_time: float

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time
