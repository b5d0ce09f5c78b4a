"""Per-request types: the request, its life-cycle state and its result."""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from rwkv7_core.engine import HostRow
from rwkv7_core.sampling import SamplingParams, TokenLogprobs

from .constraint import Constraint
from .errors import ErrorCode, FinishReason


@dataclass(frozen=True)
class InitialState:
    """A state a request starts from instead of zeros: ``row`` an engine host row (its
    logits, if any, are unused); ``key`` names its content in prefix-cache keys (``of``
    derives it from the bytes, so equal states share cache entries and different ones never)."""
    row: HostRow
    key: str

    @classmethod
    def of(cls, row: HostRow) -> "InitialState":
        digest = hashlib.sha256()
        for a in row:
            if a is not None:
                a = np.ascontiguousarray(a)
                digest.update(f"{a.dtype.str}{a.shape}".encode())
                digest.update(a.tobytes())
        return cls(tuple(row), digest.hexdigest())


@dataclass(frozen=True)
class Request:
    """One prompt to complete. ``prompt_tokens``: token ids (non-empty, each < vocab_size).
    ``initial_state``: start from this state (None = zeros). ``return_state``: put the state
    after the prompt and every emitted token in ``RequestOutput.final_state`` (a stop token,
    never emitted, is not consumed); with ``max_tokens=0`` the prompt is still prefilled.
    ``constraint``: the output must match it (scheduler/constraint.py; needs a tokenizer and an
    engine with ``Capability.TOKEN_MASK``): every draw is masked to the tokens it allows, and
    the request finishes "stop" once it is complete ("length" at max_tokens before that).
    ``cache_salt``: the prefix-cache namespace beside the initial state: cached prefixes are
    shared only between requests with the same salt (a client's secret keeps its prompts from
    being probed through the cache's timing or ``cached_tokens``; "" = the shared namespace)."""
    id: str
    prompt_tokens: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    initial_state: InitialState | None = None
    return_state: bool = False
    constraint: Constraint | None = None
    cache_salt: str = ""


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


def final_state(reason: FinishReason) -> RequestState:
    """The final state a finish reason puts a request in."""
    return {FinishReason.ERROR: RequestState.FAILED,
            FinishReason.CANCELLED: RequestState.CANCELLED}.get(FinishReason(reason), RequestState.FINISHED)


@dataclass(frozen=True)
class RequestOutput:
    """Result of one request. Times are ``time.perf_counter()`` seconds; ``first_token_time``
    is None when no token was sampled. ``tokens`` excludes the prompt and any stop token; when
    a stop string matched, it ends with the token that completed the match."""
    id: str
    tokens: list[int]
    finish_reason: FinishReason
    error: str | None                   # why it failed (for people), with finish_reason "error"
    prompt_tokens: int
    generated_tokens: int
    arrival_time: float
    first_token_time: float | None
    finish_time: float
    final_state: HostRow | None = None  # with Request.return_state, when finished "length" / "stop"
    stop_token: int | None = None       # the stop token that ended it (drawn, not in tokens)
    stop_logprobs: TokenLogprobs | None = None  # its TokenLogprobs (N=1), with params.logprobs
    cached_tokens: int = 0              # prompt tokens served by the prefix cache (not prefilled)
    error_code: ErrorCode | None = None  # what kind of failure, with finish_reason "error"

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time
