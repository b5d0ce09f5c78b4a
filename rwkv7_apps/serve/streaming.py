"""Incremental text for streamed tokens: UTF-8-safe deltas, stop strings, SSE framing."""
from __future__ import annotations

import codecs
import json
from typing import Any, Sequence


class TextStream:
    """Turns token bytes into text deltas that never split a UTF-8 character and never show
    a stop string: bytes of an incomplete character wait for the next token, and text that
    could be the start of a stop string waits until it is known not to be one.

    ``push(data)`` returns the text now safe to send; ``finish()`` returns the rest (the
    text before the first stop string if one matched; undecodable bytes become U+FFFD).
    ``stopped`` is True once a stop string appeared (later pushes return "").
    """

    def __init__(self, stops: Sequence[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = tuple(stops)
        self._held = ""
        self.stopped = False

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        return self._release(self._held + self._decoder.decode(data))

    def finish(self) -> str:
        if self.stopped:
            return ""
        text = self._release(self._held + self._decoder.decode(b"", final=True))
        rest, self._held = self._held, ""
        return text + rest

    def _release(self, text: str) -> str:
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, self._held = True, ""
            return text[:cut]
        keep = max((n for s in self._stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


def sse(payload: Any) -> str:
    """One Server-Sent Event carrying ``payload`` (a JSON-able object, or the string [DONE])."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"
