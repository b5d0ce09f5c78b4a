"""Per-request types: the request, its life-cycle state and its result."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

from rwkv7_core.sampling import SamplingParams

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


def final_state(reason: str) -> RequestState:
    """The final state a finish reason puts a request in."""
    if reason not in FINISH_REASONS:
        raise ValueError(f"unknown finish reason {reason!r}; one of {FINISH_REASONS}")
    return {"error": RequestState.FAILED, "cancelled": RequestState.CANCELLED}.get(reason, RequestState.FINISHED)


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
