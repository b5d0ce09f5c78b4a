"""Structured outputs and tool calling through rwkv7-serve (torch backend, tiny random model
with the World vocabulary), driven by the official openai client. With random weights the
model writes junk unless constrained: every constrained answer that finishes "stop" must
match its constraint."""
from __future__ import annotations

import json
import re
from typing import Literal

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")

from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

MODEL = "tiny-structured"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--random-model", "tiny-world", "--backend", "torch", "--max-batch", "4",
                         "--served-model-name", MODEL, "--max-tokens", "48", "--temperature", "1.0"],
                        tmp_path_factory.mktemp("serve_structured")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


class Pet(pydantic.BaseModel):
    kind: Literal["cat", "dog"]
    legs: int = pydantic.Field(ge=0, le=8)
    vaccinated: bool


def test_parse_with_a_pydantic_model_returns_a_parsed_object(client):
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe a pet"}], response_format=Pet, seed=0,
        max_tokens=40)  # the schema bounds every field: the answer completes
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Pet), choice.message
    assert Pet.model_validate_json(choice.message.content) == choice.message.parsed


def test_every_constrained_answer_that_stops_matches(client):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer", "score"], "additionalProperties": False}
    base = dict(model=MODEL, messages=[{"role": "user", "content": "Go"}], max_tokens=30, n=3, seed=5)
    out = client.chat.completions.create(**base, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}})
    stopped = [c for c in out.choices if c.finish_reason == "stop"]
    assert stopped
    for c in stopped:
        jsonschema.validate(json.loads(c.message.content), schema)
    obj = client.chat.completions.create(**base, response_format={"type": "json_object"})
    for c in obj.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict)
    choice = client.completions.create(model=MODEL, prompt="Pick", max_tokens=10, n=4, seed=1,
                                       extra_body={"guided_choice": ["alpha", "beta", "gamma"]})
    assert {c.finish_reason for c in choice.choices} == {"stop"}
    assert {c.text for c in choice.choices} <= {"alpha", "beta", "gamma"}
    regex = client.completions.create(model=MODEL, prompt="Id", max_tokens=12, seed=2,
                                      extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}})
    assert regex.choices[0].finish_reason == "stop" and re.fullmatch("[A-Z]{2}-[0-9]{3}", regex.choices[0].text)
    lark = client.completions.create(model=MODEL, prompt="Sum", max_tokens=12, seed=3,
                                     extra_body={"guided_grammar": 'start: NUM "+" NUM\nNUM: /[1-9]/'})
    assert lark.choices[0].finish_reason == "stop" and re.fullmatch("[1-9][+][1-9]", lark.choices[0].text)
    closed = client.completions.create(model=MODEL, prompt="Obj", max_tokens=30, seed=4, extra_body={
        "structured_outputs": {"json": {"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"]},
                               "disable_additional_properties": True, "disable_any_whitespace": True}})
    assert closed.choices[0].finish_reason == "stop" and json.loads(closed.choices[0].text) in ({"a": 1}, {"a": 2})
    # the same request gives the same answer whatever else shares its batch
    alone = client.completions.create(model=MODEL, prompt="Id", max_tokens=12, seed=2,
                                      extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"})
    assert alone.choices[0].text == regex.choices[0].text
    # a grammar that cannot complete within max_tokens ends "length" (5 tokens hold no 1000 digits)
    endless = client.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body={"guided_regex": "[0-9]{1000}"})
    assert endless.choices[0].finish_reason == "length"


def test_tool_call_round_trip_and_streamed_deltas(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                       "required": ["city"], "additionalProperties": False}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice="required",
                                           parallel_tool_calls=False, seed=0, max_tokens=40)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=5, seed=0)
    assert second.choices[0].message.tool_calls is None  # "auto": the junk answer is text, not a call
    # the call and its result went into the prompt as turns
    assert second.usage.prompt_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens + 5
    # streamed, the call's deltas (name first, then argument pieces) reassemble to the whole answer's call
    named = dict(model=MODEL, messages=messages[:1], tools=tools, seed=3, max_tokens=40,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**named).choices[0]
    calls, reasons, content = {}, [], ""
    with client.chat.completions.stream(**named) as stream:  # the SDK's own reassembly, and the raw chunks
        for event in stream:
            for c in event.chunk.choices if event.type == "chunk" else []:
                reasons.append(c.finish_reason)
                content += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    slot = calls.setdefault(d.index, {"name": "", "arguments": "", "pieces": 0})
                    slot["name"] += d.function.name or ""
                    slot["arguments"] += d.function.arguments or ""
                    slot["pieces"] += 1
        final = stream.get_final_completion().choices[0]
    assert whole.finish_reason == reasons[-1] == final.finish_reason == "tool_calls" and content == ""
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [(c["name"], c["arguments"]) for c in calls.values()] == expected
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == expected
    assert calls[0]["pieces"] > 2 and json.loads(calls[0]["arguments"])["city"] in ("Paris", "Oslo")


def test_required_parallel_calls_are_each_valid(client):
    """tool_choice "required" with parallel calls (the default): every choice that finishes
    "tool_calls" holds one or more calls, each of a listed tool with valid arguments."""
    params = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": name, "parameters": params}} for name in ("inc", "dec")]
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count"}], tools=tools,
                                         tool_choice="required", n=4, seed=21, max_tokens=48)
    finished = [c for c in out.choices if c.finish_reason == "tool_calls"]
    assert finished and all(c.finish_reason == "length" for c in out.choices if c not in finished)
    assert any(len(c.message.tool_calls) > 1 for c in finished)  # this seed's answers hold several calls
    for c in finished:
        assert c.message.content is None and len({t.id for t in c.message.tool_calls}) == len(c.message.tool_calls)
        for t in c.message.tool_calls:
            assert t.function.name in ("inc", "dec")
            jsonschema.validate(json.loads(t.function.arguments), params)


def test_auto_tool_choice_streams_text_as_it_comes(client):
    """Under "auto" the random model's answer is text (it never writes the call marker, which
    the grammar would then hold to a valid call): content, no tool_calls, streamed in several
    deltas that join to the whole answer of the same seed."""
    tools = [{"type": "function", "function": {"name": "clock", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]
    base = dict(model=MODEL, messages=[{"role": "user", "content": "Time?"}], tools=tools, seed=11, max_tokens=12)
    whole = client.chat.completions.create(**base).choices[0]
    assert whole.message.tool_calls is None and whole.finish_reason in ("stop", "length")
    assert whole.message.content and "<tool_call>" not in whole.message.content
    deltas = [c.delta for chunk in client.chat.completions.create(**base, stream=True) for c in chunk.choices]
    texts = [d.content for d in deltas if d.content]
    assert len(texts) > 1 and "".join(texts) == whole.message.content
    assert not any(d.tool_calls for d in deltas)
    # with a JSON response_format the answer that makes no call is that JSON
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    shaped = client.chat.completions.create(**{**base, "max_tokens": 20}, response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}).choices[0]
    assert shaped.finish_reason == "stop" and shaped.message.tool_calls is None
    assert isinstance(json.loads(shaped.message.content)["ok"], bool)


@pytest.mark.parametrize("kw, field, words", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "response_format", "nope"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}),
     "response_format", "if"),
    (dict(extra_body={"guided_regex": "(["}), "guided_regex", "regex"),
    (dict(tools=[{"type": "function", "function": {"parameters": {}}}]), "tools", "name"),
    (dict(tool_choice="required"), "tool_choice", "no tools"),
    (dict(extra_body={"structured_outputs": {"json_object": "yes"}}), "structured_outputs", "json_object"),
    (dict(extra_body={"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}), "structured_outputs",
     "whitespace_pattern"),
    (dict(extra_body={"structured_outputs": {"jsn": {}}}), "structured_outputs", "jsn"),
    (dict(response_format={"type": "json_object"}, tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice="required"), "response_format", "tool_choice"),
    (dict(extra_body={"guided_regex": "a+"}, tools=[{"type": "function", "function": {"name": "f"}}]),
     "guided_regex", "tool_choice"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
          tools=[{"type": "function", "function": {"name": "f"}}]), "response_format", "nope"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]), "tools", "nope"),
])
def test_bad_constraints_are_400_naming_the_problem(client, kw, field, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], **kw)
    assert e.value.body["param"] == field and words in e.value.body["message"], e.value.body
