"""rwkv7_core.text_checks: the first unpaired surrogate of a parsed JSON value is found with its
field path, character index and code point; paired escapes and plain text pass."""
from __future__ import annotations

import json

import numpy as np

from rwkv7_core.text_checks import printable, unpaired_surrogate


def _text(rng, n):
    return "".join(chr(int(c)) for c in rng.choice([*range(0x20, 0x7f), 0xe9, 0x4e2d, 0x1f600], n))


def test_finds_the_first_unpaired_surrogate_at_any_depth():
    rng = np.random.default_rng()
    for _ in range(50):
        body = {"id": _text(rng, 5), "messages": [{"role": "user", "content": _text(rng, 12)} for _ in range(3)],
                "stop": [_text(rng, 3), _text(rng, 4)]}
        assert unpaired_surrogate(json.loads(json.dumps(body))) is None
        m, i = int(rng.integers(3)), int(rng.integers(13))
        code = int(rng.integers(0xD800, 0xE000))
        content = body["messages"][m]["content"]
        body["messages"][m]["content"] = content[:i] + chr(code) + content[i:]
        found = unpaired_surrogate(json.loads(json.dumps(body)))  # the escape survives a JSON round trip
        assert found == (f"messages[{m}].content", i, code), found
        assert found.message().encode("utf-8")  # the message itself can be written


def test_a_paired_escape_is_one_character_and_passes():
    assert unpaired_surrogate(json.loads('{"p": "\\ud83d\\ude00"}')) is None
    assert unpaired_surrogate(json.loads('{"p": "\\ude00\\ud83d"}')).char_index == 0  # reversed: unpaired


def test_keys_count_and_are_named_printably():
    found = unpaired_surrogate(json.loads('{"ok": 1, "a\\udc00": 2}'))
    assert found.path == "a\\udc00" and found.char_index == 1 and printable("a\udc00") == "a\\udc00"
    deep = json.loads("[" * 500 + '"\\ud800"' + "]" * 500)
    assert unpaired_surrogate(deep).path == "[0]" * 500
