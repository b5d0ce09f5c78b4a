"""The tool-call format (rwkv7_apps/serve/tool_calls.py) against llguidance with the World
tokenizer: the grammar of tool_choice "auto" accepts free text, and once the marker is written
only a valid call of a declared tool; random walks through the grammar's allowed tokens give
text that the reader turns into calls valid under their tools' schemas, whole or cut into
random deltas alike."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rwkv7_apps.serve.tool_calls import MARKER, CallReader, ToolPlan
from rwkv7_core.constants import END_OF_TEXT
from rwkv7_core.tokenizer import WorldTokenizer
from scheduler.constraint import Constraint
from scheduler.grammar import grammars_for

jsonschema = pytest.importorskip("jsonschema")

TOOLS = {"weather": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                      "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                     "required": ["city", "days"], "additionalProperties": False},
         "clock": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                   "additionalProperties": False}}


@pytest.fixture(scope="module")
def tok():
    return WorldTokenizer()


def plan(forced=None, parallel=True, answer=None) -> ToolPlan:
    return ToolPlan(TOOLS, {n: n for n in TOOLS}, forced, parallel, answer)


def matcher(tok, p: ToolPlan):
    return grammars_for(tok, tok.vocab_size).matcher(Constraint.grammar(p.grammar()))


def accepts(tok, p: ToolPlan, text: str) -> bool:
    m = matcher(tok, p)
    for t in tok.encode(text):
        m.consume(t)
        if m.error:
            return False
    return m.ll.is_accepting()


def read(text: str, cuts=(), reader=None) -> tuple[str, list[dict], dict]:
    """(content deltas joined, call deltas reassembled, message) of ``text`` fed in pieces."""
    reader, content, calls, at = reader or CallReader(), "", {}, 0
    for cut in [*cuts, len(text)]:
        c, deltas = reader.feed(text[at:cut])
        content, at = content + c, cut
        for d in deltas:
            slot = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += d.get("id", "")
            slot["name"] += d["function"].get("name", "")
            slot["arguments"] += d["function"].get("arguments", "")
    content += reader.finish()
    return content, [calls[i] for i in sorted(calls)], reader.message()


def call(name: str, arguments: dict) -> str:
    return MARKER + json.dumps({"name": name, "arguments": arguments})


def test_auto_accepts_text_or_valid_calls_only(tok):
    auto = plan()
    assert accepts(tok, auto, "Plain text, even <tool and <b>tags</b>.\nMore.")
    assert accepts(tok, auto, "Let me see." + call("weather", {"city": "Oslo", "days": 2})
                   + "\n" + call("clock", {"zone": "UTC"}))
    assert not accepts(tok, auto, "x" + call("stocks", {}))                          # no such tool
    assert not accepts(tok, auto, call("weather", {"city": "Rome", "days": 2}))      # not in the enum
    assert not accepts(tok, auto, call("weather", {"city": "Oslo", "days": 2}) + " and then text")
    two = call("clock", {"zone": "UTC"}) + "\n" + call("clock", {"zone": "CET"})
    assert not accepts(tok, plan(parallel=False), two)
    assert not accepts(tok, plan("required"), "Text first" + call("clock", {"zone": "UTC"}))
    assert accepts(tok, plan("clock", parallel=False), " " + call("clock", {"zone": "CET"}))
    assert not accepts(tok, plan("clock", parallel=False), call("weather", {"city": "Oslo", "days": 1}))


def test_a_json_answer_or_calls_from_the_start(tok):
    """response_format json_schema with tools under "auto": the answer is that JSON (the
    marker inside one of its strings is text), or calls from its start."""
    p = plan(answer={"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"],
                     "additionalProperties": False})
    note = '{"note": "see <tool_call> here"}'
    assert accepts(tok, p, note) and accepts(tok, p, " " + call("clock", {"zone": "UTC"}))
    assert not accepts(tok, p, "Free text") and not accepts(tok, p, "x" + call("clock", {"zone": "UTC"}))
    for cuts in ([], [3, 15, 16, 20]):
        assert read(note, cuts, p.reader())[2] == {"content": note}
    cut = CallReader()  # a call cut short (max_tokens, a stop string) is read, but not complete
    cut.feed("Hm." + call("clock", {"zone": "UTC"})[:-3])
    assert cut.message()["tool_calls"][0]["function"]["arguments"] == '{"zone": "UTC' and not cut.complete
    assert read(" " + call("clock", {"zone": "UTC"}), [2, 5], p.reader())[1][0]["name"] == "clock"


@pytest.mark.parametrize("forced, parallel, lead", [(None, True, "Checking now. "), ("required", True, ""),
                                                    ("weather", False, " ")])
def test_random_walks_read_as_valid_calls_whole_or_streamed(tok, forced, parallel, lead):
    rng = np.random.default_rng()
    p = plan(forced, parallel)
    for _ in range(3):
        m = matcher(tok, p)
        text = lead + MARKER
        for t in tok.encode(text):
            m.consume(t)
        ids = []
        while not m.done and len(ids) < 300:
            allowed = np.flatnonzero(np.unpackbits(m.mask(tok.vocab_size).view(np.uint8), bitorder="little"))
            if END_OF_TEXT in allowed and rng.random() < 0.5:
                break
            token = int(rng.choice(allowed[allowed != END_OF_TEXT]))
            m.consume(token)
            assert m.error is None
            ids.append(token)
        assert m.ll.is_accepting(), "a walk that ends must end on a complete answer"
        text += tok.decode(ids)
        content, _, whole = read(text, reader=p.reader())
        assert whole["content"] == (lead if lead.strip() else None)  # the text before the calls
        assert content == (whole["content"] or "")
        assert whole["tool_calls"] and (parallel or len(whole["tool_calls"]) == 1)
        for c in whole["tool_calls"]:
            name = c["function"]["name"]
            assert name in TOOLS and (forced in (None, "required") or name == forced)
            jsonschema.validate(json.loads(c["function"]["arguments"]), TOOLS[name])
        cuts = sorted(rng.choice(len(text), size=min(len(text) - 1, 12), replace=False))
        streamed_content, streamed_calls, _ = read(text, cuts, p.reader())
        assert streamed_content == content
        assert [(c["name"], c["arguments"]) for c in streamed_calls] == [
            (c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]]
