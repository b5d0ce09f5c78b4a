"""JSONL request input and crash-safe, resumable JSONL result output (standard library only).

Input lines are ``{"id": ..., "prompt": "text"}`` or ``{"id": ..., "tokens": [int, ...]}``
plus optional per-request sampling fields and ``"state": NAME`` (a registered initial
state). Output lines are whole JSON objects appended with one ``write`` each and fsynced in
small groups, so a crash leaves at most one torn last line, which the next run detects and
cuts off before it appends.

An input line is read at most ``max_line_bytes`` bytes at a time: a longer one is never held
whole (nor parsed or tokenized) and becomes an error record naming the limit.

Every output record is keyed for resumption: by its ``id``, or — for records of input
lines that have no usable id of their own (malformed JSON, a duplicate id) — by the
``line`` number they carry.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any, Iterator, NamedTuple

from rwkv7_core.text_checks import unpaired_surrogate

ResultKey = tuple[str, Any]  # ("id", id) or ("line", line number)

PROMPT_FIELDS = ("id", "prompt", "tokens", "state")
MAX_LINE_BYTES = 16 << 20  # 16 bytes for each of the default 1,048,576 prompt tokens
_SKIP_CHUNK = 1 << 20


class InputRequest(NamedTuple):
    """One well-formed input line: exactly one of prompt (str) / tokens (list[int]) is set."""

    line: int
    id: str | int
    prompt: str | None
    tokens: list[int] | None
    overrides: dict[str, Any]  # the line's sampling fields, not yet validated
    state: str | None = None   # the name of the initial state to start from (None = zeros)


class InputError(NamedTuple):
    """An input line that cannot become a request; ``key`` identifies its error record.
    ``by_line``: the record is keyed by line (the line has no id, or its id belongs to another line)."""

    line: int
    id: str | int | None
    message: str
    by_line: bool = False

    @property
    def key(self) -> ResultKey:
        return ("line", self.line) if self.by_line else ("id", self.id)


def _valid_id(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (isinstance(value, int) and not isinstance(value, bool))


def parse_line(line_no: int, text: str) -> InputRequest | InputError:
    """Parse and shape-check one input line (sampling fields are checked later, by SamplingParams)."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        return InputError(line_no, None, f"line {line_no}: malformed JSON ({e})", by_line=True)
    except RecursionError:
        return InputError(line_no, None, f"line {line_no}: malformed JSON (nested too deeply)", by_line=True)
    surrogate = unpaired_surrogate(obj)
    if surrogate:  # keyed by line: the id itself may be the bad text
        return InputError(line_no, None, f"line {line_no}: {surrogate.message()}", by_line=True)
    if not isinstance(obj, dict):
        return InputError(line_no, None, f"line {line_no}: expected a JSON object, got {type(obj).__name__}",
                          by_line=True)
    rid = obj.get("id")
    if not _valid_id(rid):
        return InputError(line_no, None, f"line {line_no}: 'id' must be a non-empty string or an integer, "
                                         f"got {rid!r}", by_line=True)
    has_prompt, has_tokens = "prompt" in obj, "tokens" in obj
    if has_prompt == has_tokens:
        return InputError(line_no, rid, f"line {line_no}: give exactly one of 'prompt' (text) or "
                                        f"'tokens' (list of ints)")
    prompt, tokens = obj.get("prompt"), obj.get("tokens")
    if has_prompt and not isinstance(prompt, str):
        return InputError(line_no, rid, f"line {line_no}: 'prompt' must be a string, got {type(prompt).__name__}")
    if has_tokens and not (isinstance(tokens, list)
                           and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
        return InputError(line_no, rid, f"line {line_no}: 'tokens' must be a list of integers")
    state = obj.get("state")
    if state is not None and not (isinstance(state, str) and state):
        return InputError(line_no, rid, f"line {line_no}: 'state' must be a non-empty string (a --state NAME)")
    overrides = {k: v for k, v in obj.items() if k not in PROMPT_FIELDS}
    return InputRequest(line_no, rid, prompt, tokens, overrides, state)


def item_key(item: InputRequest | InputError) -> ResultKey:
    """The key of the output record this input line gets."""
    return item.key if isinstance(item, InputError) else ("id", item.id)


def read_requests(path: str | os.PathLike, skip=frozenset(),
                  max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[InputRequest | InputError | None]:
    """Yield every non-blank line of ``path`` as a request or an input error.

    A repeated id becomes an InputError on its later lines (the first line keeps it).
    Line numbers count from 1 and include blank lines. A line that is not valid UTF-8, whose
    JSON holds an unpaired surrogate escape, or longer than ``max_line_bytes`` (its newline not
    counted; read in bounded chunks and dropped) is an input error keyed by its line. A line
    whose result key is in ``skip`` (e.g. the keys already in the output) yields None,
    cheaply: its JSON is parsed for the id but nothing else is checked.
    """
    first_line: dict[Any, int] = {}
    with open(path, "rb") as f:
        for line_no, raw in enumerate(iter(lambda: f.readline(max_line_bytes + 1), b""), start=1):
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                while (rest := f.readline(_SKIP_CHUNK)) and not rest.endswith(b"\n"):
                    pass
                yield None if ("line", line_no) in skip else InputError(
                    line_no, None, f"line {line_no}: longer than the line limit of {max_line_bytes} bytes "
                                   f"(--max-line-bytes)", by_line=True)
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:  # never replaced: "bad\xff" and "bad\xfe" must not merge
                yield None if ("line", line_no) in skip else InputError(
                    line_no, None, f"line {line_no}: invalid UTF-8 at byte {e.start} of the line", by_line=True)
                continue
            if not text.strip():
                continue
            if skip:
                rid = _plain_id(text)
                if rid is not None and rid not in first_line and ("id", rid) in skip:
                    first_line[rid] = line_no
                    yield None
                    continue
            item = parse_line(line_no, text)
            if item.id is not None:
                if item.id in first_line:
                    item = InputError(line_no, item.id, f"line {line_no}: duplicate id {item.id!r} "
                                                        f"(first used on line {first_line[item.id]})", by_line=True)
                else:
                    first_line[item.id] = line_no
            if skip and item_key(item) in skip:
                yield None
                continue
            yield item


def _plain_id(text: str):
    """The valid id of a line that is a JSON object, else None."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    rid = obj.get("id") if isinstance(obj, dict) else None
    return rid if _valid_id(rid) and not unpaired_surrogate(rid) else None


def error_record(err: InputError) -> dict[str, Any]:
    """The output record of an input line that failed before reaching the scheduler."""
    record: dict[str, Any] = {"id": err.id, "tokens": [], "finish_reason": "error", "error": err.message,
                              "prompt_tokens": 0, "generated_tokens": 0}
    if err.by_line:
        record["line"] = err.line
    return record


def record_key(record: dict[str, Any]) -> ResultKey:
    return ("line", record["line"]) if "line" in record else ("id", record["id"])


def _written_key(raw: bytes) -> ResultKey | None:
    """The key of a line as this writer writes records (``{"id": "..."`` or ``{"id": 12``
    first, no "line" field), read without parsing the whole record; None otherwise."""
    if not raw.startswith(b'{"id": ') or not raw.endswith(b"}\n") or b'"line": ' in raw:
        return None
    if raw[7:8] == b'"':
        end = raw.find(b'"', 8)
        value = raw[8:end]
        if end < 0 or b"\\" in value or raw[end + 1:end + 3] != b", ":
            return None
        return ("id", value.decode("utf-8"))
    end = raw.find(b",", 7)
    digits = raw[7:end]
    if end < 0 or not digits.lstrip(b"-").isdigit():
        return None
    return ("id", int(digits))


class ResultWriter:
    """Append-only JSONL writer that resumes a previous run's file.

    Opening scans ``path``: complete lines give ``done`` (the keys in the file when it was
    opened; records written since are not added, so memory stays flat over a long run);
    an unterminated or unparsable last line is a torn write and is truncated away
    (reported in ``torn_bytes``). Each record is written with one ``os.write`` of a
    whole line, so a killed process never leaves a partial line behind it except the
    one being written; ``fsync`` runs every ``group`` records or ``interval`` seconds.
    The file is locked (flock) while open: a second writer gets ValueError.
    """

    def __init__(self, path: str | os.PathLike, group: int = 16, interval: float = 1.0):
        self.path = os.fspath(path)
        self.group, self.interval = group, interval
        self.done: set[ResultKey] = set()
        self.records_before = 0
        self.torn_bytes = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise ValueError("another process is writing to this file (it is locked)") from None
        self._scan()
        self._pending = 0
        self._last_sync = time.monotonic()

    def _scan(self) -> None:
        """Read the file line by line (memory: the ``done`` keys only)."""
        keep = 0      # bytes of the lines kept
        garbled = None  # a terminated line that is not a record: torn if it is the last one
        with open(self._fd, "rb", closefd=False) as f:
            for raw in f:
                if not raw.endswith(b"\n"):  # unterminated tail: a torn write
                    break
                if garbled is not None:
                    raise ValueError(f"{self.path!r} holds a line that is not a result record "
                                     f"({garbled[:80]!r}); refusing to append to it")
                if raw.strip():
                    try:
                        self.done.add(_written_key(raw) or record_key(json.loads(raw)))
                    except (ValueError, KeyError, TypeError):
                        garbled = raw
                        continue
                    self.records_before += 1
                keep += len(raw)
        self.torn_bytes = os.fstat(self._fd).st_size - keep
        if self.torn_bytes:
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as a whole line; fsync when the group is full or old enough."""
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view):]
        self._pending += 1
        if self._pending >= self.group or time.monotonic() - self._last_sync >= self.interval:
            self.sync()

    def sync(self) -> None:
        if self._pending:
            os.fsync(self._fd)
            self._pending = 0
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
