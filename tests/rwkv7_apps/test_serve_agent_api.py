"""rwkv7-serve on the tiny-world random model, driven by the official openai client as agent
frameworks drive it: SDK objects sent back, current request fields, GET /v1/models/{id},
x-request-id, /v1/embeddings, OpenAI's sampling defaults, and the Responses API's function
tools (tool_choice, parallel calls, round trips through previous_response_id and a full
input list, streamed call events) and structured output. One server. A random-weight model
rarely closes free-form JSON: the schemas here are closed, with enums."""
from __future__ import annotations

import json
import uuid

import pytest

openai = pytest.importorskip("openai")

from tests.rwkv7_apps.agent_types import CITIES, Verdict  # noqa: E402
from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

MODEL = "tiny-agent"
CITY = {"type": "string", "enum": list(CITIES)}
WEATHER = {"type": "function", "name": "weather", "description": "The weather of a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"],
                          "additionalProperties": False}}
TIME = {"type": "function", "name": "time", "description": "The time in a city", "strict": True,
        "parameters": {"type": "object", "properties": {"city": CITY, "zone": {"enum": ["utc", "local"]}},
                       "required": ["city", "zone"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--random-model", "tiny-world", "--max-batch", "4", "--served-model-name", MODEL,
                         "--max-tokens", "24", "--log-level", "info"], tmp_path_factory.mktemp("serve_agent")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _chat_tools():
    return [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]


def test_sdk_objects_sent_back_and_current_fields_are_accepted(client):
    """The everyday loop: the reply's message model_dump() (audio / function_call /
    annotations / refusal nulls) and a tool turn go back; new fields are accepted."""
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=_chat_tools(),
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=24,
                                           reasoning_effort="low", verbosity="low", prompt_cache_key="k1",
                                           safety_identifier="user-1", temperature=None, top_p=None)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
    dumped = message.model_dump()
    assert dumped["audio"] is None and dumped["function_call"] is None and "annotations" in dumped
    messages += [{**dumped, "reasoning_content": None},
                 {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"}]
    again = client.chat.completions.create(model=MODEL, messages=messages, tools=_chat_tools(), max_tokens=4)
    assert again.choices[0].message.role == "assistant"
    one = client.completions.create(model=MODEL, prompt="Once", best_of=1, max_tokens=3, temperature=0)
    assert one.choices[0].finish_reason in ("length", "stop")
    for call, field in ((lambda: client.completions.create(model=MODEL, prompt="x", best_of=2), "best_of"),
                        (lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                                modalities=["text", "audio"]), "modalities"),
                        (lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
                            {"type": "text", "text": "What is it?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]),
                         "messages[0].content[1].type")):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == field and "not supported" in e.value.body["message"]


def test_models_retrieve_request_ids_and_embeddings(server, client):
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.model_extra["sampling_defaults"]["temperature"] == 1.0
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert MODEL in e.value.body["message"]
    reply = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                           max_tokens=2)
    assert reply.headers["x-request-id"].startswith("req_") and reply.parse()._request_id == reply.headers[
        "x-request-id"]
    mine = "trace-" + uuid.uuid4().hex
    reply = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                           max_tokens=2, extra_headers={"x-request-id": mine})
    assert reply.headers["x-request-id"] == mine
    assert f"[{mine}] POST /v1/chat/completions -> 200" in server.log_text()
    with pytest.raises(openai.NotFoundError, match="embeddings are not served") as e:
        client.embeddings.create(model=MODEL, input="x")
    assert e.value.response.headers["x-request-id"]


def test_omitted_temperature_samples_as_openai_does(client):
    """n=3 without a temperature: three draws (OpenAI's default, temperature 1); greedy with 0."""
    say = [{"role": "user", "content": "Tell me something"}]
    sampled = client.chat.completions.create(model=MODEL, messages=say, n=3, max_tokens=12, stop=[])
    assert len({c.message.content for c in sampled.choices}) > 1
    greedy = client.chat.completions.create(model=MODEL, messages=say, n=3, max_tokens=12, temperature=0)
    assert len({c.message.content for c in greedy.choices}) == 1


def _calls(response):
    return [item for item in response.output if item.type == "function_call"]


def test_responses_tool_choice_and_parallel_calls(client):
    base = dict(model=MODEL, input="Weather and time in Rome?", tools=[WEATHER, TIME], max_output_tokens=60)
    named = client.responses.create(**base, tool_choice={"type": "function", "name": "time"},
                                    parallel_tool_calls=False)
    (call,) = _calls(named)
    assert named.status == "completed" and call.name == "time" and call.status == "completed"
    args = json.loads(call.arguments)
    assert args["city"] in CITY["enum"] and args["zone"] in ("utc", "local")
    assert named.tool_choice.name == "time" and named.parallel_tool_calls is False and len(named.tools) == 2
    required = client.responses.create(**base, tool_choice="required", parallel_tool_calls=False)
    assert len(_calls(required)) == 1 and _calls(required)[0].name in ("weather", "time")
    assert [i.type for i in required.output] == ["function_call"]
    none = client.responses.create(**{**base, "max_output_tokens": 8}, tool_choice="none", temperature=0)
    assert not _calls(none) and none.output[0].type == "message"
    plain = client.responses.create(model=MODEL, input="Weather and time in Rome?", temperature=0,
                                    max_output_tokens=8)
    assert none.output_text == plain.output_text
    for _ in range(3):  # auto: text, calls, or both; every call is whole or cut by max_output_tokens
        auto = client.responses.create(**{**base, "max_output_tokens": 24})
        for c in _calls(auto):
            assert c.status == "incomplete" or json.loads(c.arguments)["city"] in CITY["enum"]


def test_a_tool_round_trip_through_previous_response_id_and_a_full_input(client):
    """The call goes back as the model wrote it and the result as a Tool turn, chained (the
    tools listed once: a continuation with the same tools does not list them again) or as
    a whole input list (the SDK's output items as they came)."""
    tools = dict(tools=[WEATHER], parallel_tool_calls=False, temperature=0)
    first = client.responses.create(model=MODEL, input="Weather in Oslo?", tool_choice="required",
                                    max_output_tokens=40, **tools)
    (call,) = _calls(first)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    chained = client.responses.create(model=MODEL, previous_response_id=first.id, input=[result],
                                      max_output_tokens=8, **tools)
    full_input = [{"role": "user", "content": "Weather in Oslo?"},
                  *[item.model_dump(exclude_none=True) for item in first.output], result]
    whole = client.responses.create(model=MODEL, input=full_input, max_output_tokens=8, **tools)
    listed = first.usage.input_tokens - client.responses.create(
        model=MODEL, input="Weather in Oslo?", max_output_tokens=1).usage.input_tokens
    assert listed > 20  # the tools' system turn
    grown = chained.usage.input_tokens - first.usage.input_tokens - first.usage.output_tokens
    assert 0 < grown < listed  # the result's turn, the tools not listed again
    assert abs(whole.usage.input_tokens - chained.usage.input_tokens) <= 4  # token borders may differ
    for response in (chained, whole):
        assert response.status in ("completed", "incomplete") and response.output
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input=[{"type": "reasoning", "id": "r1", "summary": []}])
    assert "not supported" in e.value.body["message"] and e.value.body["param"].startswith("input[0]")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type" and "not supported" in e.value.body["message"]


def test_streamed_function_call_events_parse_as_the_sdk_reads_them(client):
    with client.responses.stream(model=MODEL, input="Weather?", tools=[WEATHER], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=40) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    (call,) = _calls(final)
    assert call.parsed_arguments["city"] in CITY["enum"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == call.arguments == done[0].arguments
    assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta")
    assert kinds[-2:] == ["response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_structured_output_through_text_format(client):
    parsed = client.responses.parse(model=MODEL, input="Judge it", text_format=Verdict, max_output_tokens=40)
    assert isinstance(parsed.output_parsed, Verdict) and parsed.text.format.type == "json_schema"
    free = client.responses.create(model=MODEL, input="Any JSON", text={"format": {"type": "json_object"}},
                                   max_output_tokens=24)
    if free.status == "completed":
        assert isinstance(json.loads(free.output_text), dict)
    else:
        assert free.output_text.startswith("{")
    bad = {"type": "object", "properties": {"x": {"type": "nonsense"}}}
    for kw, param in ((dict(text={"format": {"type": "json_schema", "name": "bad", "schema": bad}}), "text.format"),
                      (dict(tools=[{**WEATHER, "parameters": bad}]), "tools")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="x", **kw)
        assert e.value.body["param"] == param and e.value.body["message"].startswith(param)
        assert "response_format" not in e.value.body["message"] and ".function." not in e.value.body["message"]
    with client.responses.stream(model=MODEL, input="Judge it", text_format=Verdict, max_output_tokens=40) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Verdict)
