"""The tool-call text format, defined once: the grammar that constrains an answer to it, the
system text that asks for it, the history text of earlier calls, and the reader that turns an
answer (whole, or streamed delta by delta) into OpenAI ``tool_calls``.

An answer with tools is free text, or text followed by one or more calls; each call is
``<tool_call>`` and one compact JSON object ``{"name": NAME, "arguments": {...}}`` (", " and
": " separators, "name" first), calls separated by a newline (several only when parallel)::

    Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}
    <tool_call>{"name": "weather", "arguments": {"city": "Paris"}}

Under ``tool_choice`` "auto" the grammar lets the text run free until it writes the marker;
from there the call must be a declared tool with arguments valid under its schema. "required"
or a named function allows no text before the first call (a space at most). With a JSON
``response_format`` under "auto" the answer is that JSON, or calls from its start.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from scheduler.grammar import JSON_OPTIONS

MARKER = "<tool_call>"
SEPARATOR = "\n"
_HEAD = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools: ``tools`` {name: parameters schema}; ``forced``: None (auto),
    "required" or the named function; ``parallel``: several calls allowed; ``answer``: the
    JSON schema an answer that makes no call must follow (None: free text)."""
    tools: dict[str, dict]
    descriptions: dict[str, str]
    forced: str | None
    parallel: bool
    answer: dict | None = None

    def call_schema(self) -> dict:
        """JSON schema of one call object (of the named function when one is forced)."""
        names = [self.forced] if self.forced not in (None, "required") else list(self.tools)
        one = [{"type": "object", "properties": {"name": {"const": n}, "arguments": self.tools[n]},
                "required": ["name", "arguments"], "additionalProperties": False} for n in names]
        return one[0] if len(one) == 1 else {"anyOf": one}

    def grammar(self) -> str:
        """The Lark grammar (llguidance's dialect) of an answer in this format. Text before
        the first call is one lazy lexeme ending at the marker; the text-only branch excludes
        the marker, so once it is written a valid call must follow."""
        schema = json.dumps({**self.call_schema(), "x-guidance": JSON_OPTIONS})
        more = f' ({json.dumps(SEPARATOR)} {json.dumps(MARKER)} call)*' if self.parallel else ""
        if self.forced is None and self.answer is not None:
            answer = json.dumps({**self.answer, "x-guidance": JSON_OPTIONS})
            return (f'start: answer | " "? {json.dumps(MARKER)} call{more}\n'
                    f"answer: %json {answer}\ncall: %json {schema}\n")
        if self.forced is None:
            marker = re.escape(MARKER)
            return (f"start: TEXT | intro call{more}\n"
                    f"intro[lazy]: /(?s:.*){marker}/\n"
                    f"TEXT: /(?s:.*)/ & ~/(?s:.*){marker}(?s:.*)/\n"
                    f"call: %json {schema}\n")
        return f'start: " "? {json.dumps(MARKER)} call{more}\ncall: %json {schema}\n'

    def reader(self) -> "CallReader":
        """A reader of one answer (calls only from the start when no free text precedes them)."""
        return CallReader(calls_first=self.forced is not None or self.answer is not None)

    def system_text(self) -> str:
        """The system turn that lists the tools to the model and shows the format."""
        listed = [{"name": n, "description": self.descriptions[n], "parameters": p} for n, p in self.tools.items()]
        example = MARKER + '{"name": ..., "arguments": {...}}'
        several = ", one per line" if self.parallel else " (one call at most)"
        return ("You can call these functions: " + json.dumps(listed, ensure_ascii=False)
                + f". To call a function, write {example}{several}.")


def history_text(content: str, calls: list[dict]) -> str:
    """An assistant turn that made ``calls`` (OpenAI tool_calls) as the model writes it."""
    written = []
    for call in calls:
        function = call.get("function") or {}
        arguments = (function.get("arguments") or "").strip() or "{}"
        written.append(MARKER + '{"name": ' + json.dumps(function.get("name"), ensure_ascii=False)
                       + ', "arguments": ' + arguments + "}")
    return content + SEPARATOR.join(written)


@dataclass
class _Call:
    index: int
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])
    name: str | None = None
    arguments: str = ""
    done: bool = False


class CallReader:
    """Reads one answer in the format: ``feed(text)`` returns (content delta, tool-call
    deltas) as soon as they are certain (text that could be the start of the marker, and
    leading whitespace, wait); ``finish()`` returns the rest of the content. Deltas are
    OpenAI's: a call's first carries its index, id, type and name, later ones argument text.
    ``content`` and ``calls`` hold the whole answer read so far; streamed and whole answers
    read the same.
    ``calls_first``: calls may only open the answer (after spaces); text that does not begin
    with the marker is all content (a JSON answer may hold the marker in a string)."""

    def __init__(self, calls_first: bool = False):
        self.calls_first = calls_first
        self._text_only = False
        self.content = ""
        self.calls: list[_Call] = []
        self._pending = ""      # text not yet given out
        self._in_calls = False
        self._depth = 0         # the current call's JSON nesting, while in its arguments
        self._string = self._escape = False

    def feed(self, text: str) -> tuple[str, list[dict]]:
        self._pending += text
        content, deltas = "", []
        if self.calls_first and not self._in_calls and not self._text_only:
            lead = self._pending.lstrip(" ")
            if MARKER.startswith(lead):
                return "", []  # spaces, or the start of the marker, so far
            self._text_only = not lead.startswith(MARKER)
        if self._text_only:
            ready, self._pending = self._pending, ""
            self.content += ready
            return ready, []
        if not self._in_calls:
            at = self._pending.find(MARKER)
            if at < 0:
                keep = _partial_marker(self._pending)
                ready = self._pending[:len(self._pending) - keep]
                if not (self.content + ready).strip():
                    return "", []  # only whitespace so far: text or a call's lead
                self._pending = self._pending[len(ready):]
                self.content += ready
                return ready, []
            ready = self._pending[:at]
            if (self.content + ready).strip():
                content, self.content = ready, self.content + ready
            self._pending, self._in_calls = self._pending[at + len(MARKER):], True
        while self._in_calls and self._pending:
            call = self.calls[-1] if self.calls and not self.calls[-1].done else None
            if call is None:
                if self.calls:  # between calls: the separator and the next marker
                    lead = SEPARATOR + MARKER
                    if not lead.startswith(self._pending[:len(lead)]):
                        break  # not the format (cannot happen under its grammar)
                    if len(self._pending) < len(lead):
                        break
                    self._pending = self._pending[len(lead):]
                call = _Call(len(self.calls))
                self.calls.append(call)
            if call.name is None:
                head = _HEAD.match(self._pending)
                if head is None:
                    break
                call.name = json.loads(head.group(1))
                self._pending = self._pending[head.end():]
                self._depth, self._string, self._escape = 1, False, False
                deltas.append({"index": call.index, "id": call.id, "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
            used, call.done = self._scan(self._pending)
            piece, self._pending = self._pending[:used], self._pending[used + call.done:]
            if piece:
                call.arguments += piece
                deltas.append({"index": call.index, "function": {"arguments": piece}})
        return content, _merged(deltas)

    def finish(self) -> str:
        """The held text of an answer that wrote no call ("" once calls began: what is left
        then is an unfinished call's head)."""
        rest, self._pending = ("" if self._in_calls else self._pending), ""
        self.content += rest
        return rest

    def _scan(self, text: str) -> tuple[int, bool]:
        """How many characters of ``text`` are arguments, and whether the call object closed
        right after them (its closing brace is not part of the arguments)."""
        for i, ch in enumerate(text):
            if self._escape:
                self._escape = False
            elif self._string:
                self._escape, self._string = ch == "\\", ch != '"'
            elif ch == '"':
                self._string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i, True
        return len(text), False

    @property
    def complete(self) -> bool:
        """Every call begun is whole (not cut by max_tokens or a stop string)."""
        return not self._in_calls or (bool(self.calls) and all(c.done for c in self.calls))

    def message(self) -> dict:
        """The finished answer's message fields: its calls (content: the text before them,
        or None), else its text."""
        named = [c for c in self.calls if c.name is not None]
        if not named:
            return {"content": self.content}
        return {"content": self.content or None,
                "tool_calls": [{"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}} for c in named]}


def _partial_marker(text: str) -> int:
    """Length of the longest end of ``text`` that begins the marker."""
    for k in range(min(len(text), len(MARKER) - 1), 0, -1):
        if MARKER.startswith(text[-k:]):
            return k
    return 0


def _merged(deltas: list[dict]) -> list[dict]:
    """Tool-call deltas with each call's pieces of one event joined."""
    out: dict[int, dict] = {}
    for d in deltas:
        held = out.get(d["index"])
        if held is None:
            out[d["index"]] = {**d, "function": dict(d["function"])}
        else:
            held["function"]["arguments"] = held["function"].get("arguments", "") + d["function"]["arguments"]
    return list(out.values())
