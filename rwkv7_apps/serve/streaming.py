"""Incremental text for streamed tokens: UTF-8-safe deltas, stop strings, SSE framing."""
from __future__ import annotations

import json
from typing import Any, Sequence

from rwkv7_core.stop_strings import StopMatcher


class TextStream:
    """Turns token bytes into text deltas that never split a UTF-8 character and never show
    a stop string: bytes of an incomplete character wait for the next token, and text that
    could be the start of a stop string waits until it is known not to be one.

    ``push(data)`` returns the text now safe to send; ``finish()`` returns the rest (the
    text before the first stop string to complete, if one did; undecodable bytes become
    U+FFFD). ``stopped`` is True once a stop string appeared (later pushes return "").
    Matching is linear in the text (rwkv7_core/stop_strings.py).
    """

    def __init__(self, stops: Sequence[str] = ()):
        self._stops = StopMatcher(stops)
        self._held = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        return self._release(*self._stops.feed_bytes(data))

    def finish(self) -> str:
        if self.stopped:
            return ""
        text = self._release(*self._stops.feed_bytes(b"", final=True))
        rest, self._held = self._held, ""
        return text + rest

    def _release(self, new: str, end: int) -> str:
        text = self._held + new
        if end >= 0:
            self.stopped, self._held = True, ""
            return text[:len(text) - len(new) + end - self._stops.match_length]
        keep = self._stops.pending
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


def sse(payload: Any) -> str:
    """One Server-Sent Event carrying ``payload`` (a JSON-able object, or the string [DONE])."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"
