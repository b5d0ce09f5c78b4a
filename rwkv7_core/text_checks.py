"""The one text policy of every input (JSONL lines, HTTP bodies): text must be valid Unicode.

JSON can escape a lone UTF-16 surrogate ("\\ud800"), which Python decodes into a str that
cannot be encoded as UTF-8, so it would fail later, far from the input (tokenizing, writing a
result). ``unpaired_surrogate`` finds the first one in a parsed JSON value so the input is
rejected where it enters, naming the field and the character. A correctly paired surrogate
escape ("\\ud83d\\ude00") is decoded by ``json`` into one character and passes.
"""
from __future__ import annotations

import re
from typing import Any, NamedTuple

_SURROGATE = re.compile("[\ud800-\udfff]")


class SurrogateAt(NamedTuple):
    """Where the first unpaired surrogate is: the field's path ("messages[0].content"; "" for
    the value itself), the character index in that string, and the code point."""

    path: str
    char_index: int
    code_point: int

    def message(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return (f"{where}unpaired UTF-16 surrogate U+{self.code_point:04X} at character {self.char_index} "
                f"(text must be valid Unicode)")


def printable(text: str) -> str:
    """``text`` with each unpaired surrogate written as its escape (\\udXXX): safe to encode."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def unpaired_surrogate(value: Any, path: str = "") -> SurrogateAt | None:
    """The first unpaired surrogate in the strings of a parsed JSON value (dict keys included,
    depth-first in order), or None. Iterative: any nesting depth ``json`` accepts is walked."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            m = _SURROGATE.search(item)
            if m:
                return SurrogateAt(where, m.start(), ord(m.group()))
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                name = printable(str(key))
                inner = f"{where}.{name}" if where else name
                children += [(inner, key), (inner, child)]
            stack.extend(reversed(children))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(f"{where}[{i}]", child) for i, child in enumerate(item)]))
    return None
