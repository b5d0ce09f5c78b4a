"""The field policy table (rwkv7_apps/serve/fields.py) against the openai SDK's request types:
every field the SDK can send is honoured, accepted and ignored, or refused with an error
naming it; null fields are absent; the docs' table names every ignored and refused field;
rwkv7-serve's sampling defaults are OpenAI's while the batch command stays greedy."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest

openai = pytest.importorskip("openai")

from openai.types import completion_create_params  # noqa: E402
from openai.types.chat import chat_completion_assistant_message_param  # noqa: E402
from openai.types.chat import completion_create_params as chat_params  # noqa: E402
from openai.types.responses import response_create_params  # noqa: E402

from rwkv7_apps.generate import cli as generate_cli  # noqa: E402
from rwkv7_apps.options import sampling_defaults  # noqa: E402
from rwkv7_apps.serve import cli as serve_cli  # noqa: E402
from rwkv7_apps.serve.fields import ASSISTANT_SENT_BACK, CHAT, COMPLETIONS, RESPONSES, UNSUPPORTED  # noqa: E402
from rwkv7_apps.serve.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest  # noqa: E402
from rwkv7_apps.serve.responses_protocol import ResponseRequest  # noqa: E402

DOCS = Path(__file__).resolve().parents[2] / "docs" / "server.md"
CASES = [
    (ChatCompletionRequest, CHAT, chat_params.CompletionCreateParamsBase, {"messages": [{"role": "user", "content": "x"}]}),
    (CompletionRequest, COMPLETIONS, completion_create_params.CompletionCreateParamsBase, {"prompt": "x"}),
    (ResponseRequest, RESPONSES, response_create_params.ResponseCreateParamsBase, {"input": "x"}),
    (ChatMessage, ASSISTANT_SENT_BACK, chat_completion_assistant_message_param.ChatCompletionAssistantMessageParam,
     {"role": "assistant"}),
]


def _known(model) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


@pytest.mark.parametrize("model, policy, sdk, base", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_every_sdk_field_has_a_place_in_the_table(model, policy, sdk, base):
    sdk_fields = set(sdk.__annotations__)
    unplaced = sdk_fields - _known(model) - policy.ignored - set(policy.refused)
    assert not unplaced, f"{model.__name__}: fields of the openai SDK with no policy: {sorted(unplaced)}"
    assert not (_known(model) & (policy.ignored | set(policy.refused))), "a field is in two places"
    for name in policy.ignored:
        assert model.model_validate({**base, name: {"any": ["value"]}}) == model.model_validate(base)
    for name, (allowed, _) in policy.refused.items():
        for value in allowed:
            assert model.model_validate({**base, name: value}) == model.model_validate(base)
        with pytest.raises(pydantic.ValidationError) as e:
            model.model_validate({**base, name: {"some": "value"}})
        error = e.value.errors()[0]
        assert error["type"] == UNSUPPORTED and error["ctx"]["field"] == name
        assert error["msg"].startswith(f"{name}: not supported")


@pytest.mark.parametrize("model, policy, sdk, base", CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_null_fields_are_absent(model, policy, sdk, base):
    rng = np.random.default_rng()
    optional = sorted(set(sdk.__annotations__) - set(base))
    for _ in range(5):
        picked = [str(x) for x in rng.choice(optional, size=min(6, len(optional)), replace=False)]
        assert model.model_validate({**base, **dict.fromkeys(picked)}) == model.model_validate(base)


def test_an_sdk_assistant_message_sent_back_is_a_message():
    """What ``reply.choices[0].message.model_dump()`` sends back (nulls and empty lists included)."""
    dumped = openai.types.chat.ChatCompletionMessage(
        role="assistant", content=None, tool_calls=[{"id": "call_1", "type": "function",
                                                     "function": {"name": "f", "arguments": "{}"}}]).model_dump()
    assert {"audio", "function_call", "annotations", "refusal"} <= set(dumped)
    message = ChatMessage.model_validate({**dumped, "reasoning_content": None})
    assert message.tool_calls[0]["function"]["name"] == "f" and message.content is None


def test_the_docs_table_names_every_ignored_and_refused_field():
    text = DOCS.read_text()
    for policy in (CHAT, COMPLETIONS, RESPONSES, ASSISTANT_SENT_BACK):
        for name in policy.ignored | set(policy.refused):
            assert f"`{name}`" in text, name


def test_serve_samples_as_openai_does_and_the_batch_command_stays_greedy():
    served = sampling_defaults(serve_cli.build_parser().parse_args(["--random-model", "tiny-world"]))
    assert served["temperature"] == 1.0 and served["top_p"] == 1.0
    t = float(np.random.default_rng().uniform(0.1, 2))
    chosen = serve_cli.build_parser().parse_args(["--random-model", "tiny-world", "--temperature", str(t)])
    assert sampling_defaults(chosen)["temperature"] == t
    batch = generate_cli.build_parser().parse_args(["--random-model", "tiny-world", "--input", "x", "--output", "y"])
    assert sampling_defaults(batch)["temperature"] == 0.0
