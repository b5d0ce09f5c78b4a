"""The scheduler's outcome vocabulary: why a request finished, and what kind of error
ended one that failed. Both are ``str``-valued enums: on the wire (JSON, logs, metric
labels) they read as their values ("length", "invalid_request", ...), and they compare equal
to those strings.

An application maps an ``ErrorCode`` to its own terms (an HTTP status, an error record) by
the code, never by the text of ``RequestOutput.error``, which is for people.
"""
from __future__ import annotations

from enum import StrEnum


class FinishReason(StrEnum):
    """``RequestOutput.finish_reason``."""
    LENGTH = "length"        # max_tokens drawn (or a constraint ran out of room)
    STOP = "stop"            # a stop token, stop string or a complete grammar ended it
    ERROR = "error"          # failed: ``RequestOutput.error`` says why, ``error_code`` what kind
    CANCELLED = "cancelled"  # ``cancel`` ended it


class ErrorCode(StrEnum):
    """``RequestOutput.error_code``: the kind of failure of a request finished "error"."""
    INVALID_REQUEST = "invalid_request"  # the request itself: its prompt, sampling fields or constraint
    PREFILL_FAILED = "prefill_failed"    # its prefill failed (the engine raised, or its initial state was bad)
    ENGINE_FAILED = "engine_failed"      # a decode step of the engine raised
    NONFINITE_LOGITS = "nonfinite_logits"  # the model produced non-finite logits for it
    GRAMMAR_BROKEN = "grammar_broken"    # a drawn token broke its grammar
    FINAL_STATE_FAILED = "final_state_failed"  # reading its final state (``return_state``) failed
    UNAVAILABLE = "unavailable"          # the application ended it (shutdown, a failed scheduler)
