"""Stop strings in generated text that arrives in pieces, found in time linear in the text.

One Knuth-Morris-Pratt automaton per stop string reads each new character once, so a
request costs O(generated characters x stop strings) however long its text or its stop
strings (``SamplingParams.validate`` bounds both counts), never a rescan of the text.
"""
from __future__ import annotations

import codecs
from typing import Sequence


def _failure(s: str) -> list[int]:
    """KMP failure function: ``f[i]`` = length of the longest proper prefix of ``s[:i + 1]``
    that is also its suffix."""
    f = [0] * len(s)
    q = 0
    for i in range(1, len(s)):
        while q and s[i] != s[q]:
            q = f[q - 1]
        if s[i] == s[q]:
            q += 1
        f[i] = q
    return f


class StopMatcher:
    """Finds the first stop string to complete in UTF-8 bytes or text fed piece by piece.

    ``feed(text)`` returns the index in ``text`` just past the first completed stop string
    (-1: none yet), and ``match_length`` is then that string's length (the longest one ending
    there). ``feed_bytes(data, final=False)`` decodes incrementally (an incomplete character
    waits for the next piece; invalid bytes become U+FFFD) and returns (the decoded text, what
    ``feed`` returned for it). ``pending``: length of the longest suffix of the text so far
    that begins a stop string (what a stream must hold back)."""

    def __init__(self, stops: Sequence[str]):
        self._stops = tuple(stops)
        self._failures = [_failure(s) for s in self._stops]
        self._states = [0] * len(self._stops)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.match_length = 0

    @property
    def pending(self) -> int:
        return max(self._states, default=0)

    def feed(self, text: str) -> int:
        stops, failures, states = self._stops, self._failures, self._states
        for i, c in enumerate(text):
            found = 0
            for k, s in enumerate(stops):
                q, f = states[k], failures[k]
                while q and s[q] != c:
                    q = f[q - 1]
                if s[q] == c:
                    q += 1
                if q == len(s):
                    found, q = max(found, q), f[q - 1]
                states[k] = q
            if found:
                self.match_length = found
                return i + 1
        return -1

    def feed_bytes(self, data: bytes, final: bool = False) -> tuple[str, int]:
        text = self._decoder.decode(data, final)
        return text, self.feed(text)
