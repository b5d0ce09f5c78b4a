"""The server's text pieces without a server: UTF-8-safe deltas, stop strings, chat format."""
from __future__ import annotations

import numpy as np

from rwkv7_apps.serve.chat import TURN_STOP, render
from rwkv7_apps.serve.streaming import TextStream, sse


def _stream(pieces: list[bytes], stops=()) -> list[str]:
    s = TextStream(stops)
    return [s.push(p) for p in pieces] + [s.finish()]


def test_deltas_never_split_a_character_at_any_byte_cut():
    text = "aé中🙂b" * 3
    data = text.encode()
    rng = np.random.default_rng()
    for _ in range(50):
        cuts = sorted(set(rng.integers(0, len(data), rng.integers(1, 12)).tolist()))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        deltas = _stream(pieces)
        assert "".join(deltas) == text
        assert all("\ufffd" not in d for d in deltas)


def test_stop_strings_are_held_back_and_cut():
    assert "".join(_stream([b"Hello\n", b"\nUs", b"er: more"], [TURN_STOP])) == "Hello"
    deltas = _stream([b"ab", b"c\n", b"\nx"], [TURN_STOP])
    assert deltas[1] == "c" and "".join(deltas) == "abc\n\nx"  # "\n" held until it is no stop
    s = TextStream(["END"])
    assert s.push(b"xxEN") == "xx" and s.push(b"Dyy") == "" and s.stopped and s.finish() == ""


def test_invalid_bytes_become_replacement_at_the_end():
    assert "".join(_stream([b"ok\xe4\xb8"])) == "ok\ufffd"


def test_chat_format_and_sse():
    assert render([("user", "hi\n\n\nthere")]) == "User: hi\nthere\n\nAssistant:"
    assert sse("[DONE]") == "data: [DONE]\n\n" and sse({"a": 1}) == 'data: {"a":1}\n\n'
