"""Agent frameworks against a real rwkv7-serve (tiny-world random model) on loopback: the
OpenAI Agents SDK (an agent with a function tool on its default Responses model and on its
Chat Completions model, run and streamed; an agent with a structured output type) and
langchain-openai (invoke, stream, batch, bind_tools, a tool round trip, with_structured_output,
on Chat Completions and on the Responses API). Every request must be answered without a 4xx
(the server's log lists each request's status). A random-weight model rarely closes
free-form JSON, so the tool's argument and the output types are enums."""
from __future__ import annotations

import asyncio
import re
from typing import Literal

import pytest

agents = pytest.importorskip("agents")
langchain_openai = pytest.importorskip("langchain_openai")
openai = pytest.importorskip("openai")

from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from tests.rwkv7_apps.agent_types import CITIES, Verdict  # noqa: E402
from tests.rwkv7_apps.serve_harness import running_server  # noqa: E402

MODEL = "tiny-agents"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(["--random-model", "tiny-world", "--max-batch", "4", "--served-model-name", MODEL,
                         "--max-tokens", "32", "--log-level", "info"],
                        tmp_path_factory.mktemp("serve_frameworks")) as s:
        yield s


def _statuses(server) -> list[tuple[str, int]]:
    """(path, status) of every request the server logged."""
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"\] [A-Z]+ (\S+) -> (\d+)", server.log_text())]


def _no_client_errors(server, since: int, paths: set[str]) -> None:
    seen = _statuses(server)[since:]
    assert {p for p, _ in seen} >= paths, seen
    assert all(status < 400 for _, status in seen), seen


def test_openai_agents_sdk_with_a_function_tool_on_both_models(server):
    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def weather(city: Literal["Oslo", "Paris", "Rome"]) -> str:
        """The weather of a city."""
        calls.append(city)
        return f"sunny in {city}"

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        for model in (agents.OpenAIResponsesModel(MODEL, client), agents.OpenAIChatCompletionsModel(MODEL, client)):
            settings = agents.ModelSettings(tool_choice="weather", parallel_tool_calls=False, max_tokens=32)
            agent = agents.Agent(name="forecaster", instructions="Answer with the weather.", model=model,
                                 tools=[weather], model_settings=settings, tool_use_behavior="stop_on_first_tool")
            before = len(calls)
            result = await agents.Runner.run(agent, "Weather in Oslo?", max_turns=2)
            assert len(calls) == before + 1 and calls[-1] in CITIES and result.final_output == f"sunny in {calls[-1]}"
            streamed = agents.Runner.run_streamed(agent, "Weather in Rome?", max_turns=2)
            kinds = {event.type async for event in streamed.stream_events()}
            assert {"raw_response_event", "run_item_stream_event"} <= kinds
            assert len(calls) == before + 2 and streamed.final_output == f"sunny in {calls[-1]}"
            judge = agents.Agent(name="judge", instructions="Judge the day.", model=model, output_type=Verdict,
                                 model_settings=agents.ModelSettings(max_tokens=32))
            verdict = (await agents.Runner.run(judge, "How was the day?")).final_output
            assert isinstance(verdict, Verdict)
        await client.close()

    since = len(_statuses(server))
    asyncio.run(run())
    _no_client_errors(server, since, {"/v1/responses", "/v1/chat/completions"})


def test_langchain_openai_on_chat_completions_and_responses(server):
    @tool
    def weather(city: Literal["Oslo", "Paris", "Rome"]) -> str:
        """The weather of a city."""
        return f"sunny in {city}"

    since = len(_statuses(server))
    for responses_api in (False, True):
        llm = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=MODEL, max_tokens=32,
                                          max_retries=0, use_responses_api=responses_api)
        assert llm.invoke("Hi").text is not None
        chunks = list(llm.stream("Hi"))
        assert len(chunks) > 1
        assert len(llm.batch(["One", "Two"])) == 2
        for method in ("json_schema", "function_calling"):
            verdict = llm.with_structured_output(Verdict, method=method, strict=True).invoke("Judge the day")
            assert isinstance(verdict, Verdict)
        # strict: a closed schema (langchain's own is open, and a random model adds properties till max_tokens)
        bound = llm.bind_tools([weather], tool_choice="weather", parallel_tool_calls=False, strict=True)
        asked = [HumanMessage("Weather in Oslo?")]
        ai = bound.invoke(asked)
        (call,) = ai.tool_calls
        assert call["name"] == "weather" and call["args"]["city"] in CITIES
        answer = llm.invoke(asked + [ai, ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"])])
        assert answer.text is not None
        streamed = None
        for chunk in bound.stream(asked):
            streamed = chunk if streamed is None else streamed + chunk
        assert streamed.tool_calls[0]["args"]["city"] in CITIES
    _no_client_errors(server, since, {"/v1/responses", "/v1/chat/completions"})
