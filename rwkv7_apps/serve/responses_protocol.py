"""Request body of ``POST /v1/responses`` (pydantic), under fields.py's RESPONSES policy:
what we can do is honoured, OpenAI fields with no meaning here are accepted and ignored,
refused fields, values we cannot honour and unknown fields are a 400 naming the field.
Extensions: ``top_k``, ``seed``, ``state`` (a named initial state).

The body maps onto a chat completion (``chat_fields``): function ``tools``, ``tool_choice``
and ``text.format`` become the chat body's ``tools``, ``tool_choice`` and
``response_format``, input items become chat messages (``function_call`` items an
assistant turn's ``tool_calls``, ``function_call_output`` items ``tool`` turns), so both
APIs share one grammar machinery (structured.py, tool_calls.py).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, StrictBool, StrictStr, Tag

from rwkv7_core.sampling import SCALAR_FIELDS, SEED_MAX

from .cache_namespace import CacheSalt
from .fields import RESPONSES, Policy, PolicyModel
from .limits import Metadata
from .protocol import sampling_field

SENT_BACK = Policy(frozenset({"id", "status", "phase"}))
"""An output item of an earlier response sent back as input: its id and status mean nothing here."""


class InputText(PolicyModel):
    """A text content part (``input_text`` of user/system turns, ``output_text`` of earlier
    assistant output sent back; its ``annotations`` and ``logprobs`` ignored)."""
    POLICY = Policy(frozenset({"annotations", "logprobs"}),
                    {"type": (("input_text", "output_text", "text"), "text content only")})
    text: StrictStr


class InputMessage(PolicyModel):
    """A message item (``type`` "message" or absent)."""
    POLICY = SENT_BACK
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[StrictStr, list[InputText]]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCall(PolicyModel):
    """A ``function_call`` output item of an earlier response, sent back."""
    POLICY = SENT_BACK
    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr


class FunctionCallOutput(PolicyModel):
    """A function's result for ``call_id`` (rendered as a ``Tool`` turn)."""
    POLICY = SENT_BACK
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: Union[StrictStr, list[InputText]]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


def _item_type(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return "tag:" + (kind if kind in ("message", "function_call", "function_call_output") else "unsupported")


class UnsupportedItem(PolicyModel):
    """Any other input item (reasoning, files, images, built-in tool calls): refused."""
    POLICY = Policy(refused={"type": ((), "only message, function_call and function_call_output items")})


InputItem = Annotated[Union[Annotated[InputMessage, Tag("tag:message")], Annotated[FunctionCall, Tag("tag:function_call")],
                            Annotated[FunctionCallOutput, Tag("tag:function_call_output")],
                            Annotated[UnsupportedItem, Tag("tag:unsupported")]], Discriminator(_item_type)]


FUNCTIONS_ONLY = Policy(refused={"type": (("function",), "only function tools are served")})


class FunctionTool(PolicyModel):
    """A function tool (Responses shape: the function's fields at the top)."""
    POLICY = FUNCTIONS_ONLY
    type: Literal["function"] = "function"
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict | None = None
    strict: StrictBool | None = None  # the call always follows the schema (grammar-constrained)


class NamedFunction(PolicyModel):
    POLICY = FUNCTIONS_ONLY
    type: Literal["function"] = "function"
    name: StrictStr


class TextFormat(PolicyModel):
    """``text.format``: plain text, any JSON object, or JSON under ``schema``."""
    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    schema_: dict | None = Field(None, alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None  # the output always follows the schema

    def response_format(self) -> dict:
        """The chat ``response_format`` of this format."""
        if self.type != "json_schema":
            return {"type": self.type}
        return {"type": "json_schema", "json_schema": {"name": self.name or "response", "schema": self.schema_,
                                                        "strict": self.strict}}


class TextOptions(PolicyModel):
    format: TextFormat | None = None
    verbosity: StrictStr | None = None  # IGNORED


class ResponsesStreamOptions(PolicyModel):
    include_obfuscation: StrictBool | None = None  # IGNORED: no obfuscation padding is sent


class ResponseRequest(PolicyModel):
    POLICY = RESPONSES

    model: StrictStr | None = None
    input: Union[StrictStr, list[InputItem]]
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = None
    store: StrictBool = True
    stream: StrictBool = False
    stream_options: ResponsesStreamOptions | None = None
    max_output_tokens: int | None = sampling_field("max_tokens")
    temperature: float | None = sampling_field("temperature")
    top_p: float | None = sampling_field("top_p")
    top_k: int | None = sampling_field("top_k")
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    state: StrictStr | None = None
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: StrictBool | None = None
    truncation: Literal["disabled"] | None = None   # the history is never truncated
    metadata: Metadata | None = None  # kept with the response (bounded as OpenAI bounds it)
    prompt_cache_key: CacheSalt | None = None       # a prefix-cache namespace of its own
    cache_salt: CacheSalt | None = None             # the same, vLLM's name

    def messages(self) -> list[dict]:
        """The instructions (a system turn) and the input as chat messages: consecutive
        function_call items join one assistant turn (the one right before them, if any)."""
        out: list[dict] = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        if isinstance(self.input, str):
            return out + [{"role": "user", "content": self.input}]
        for item in self.input:
            if isinstance(item, InputMessage):
                out.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallOutput):
                out.append({"role": "tool", "content": item.text(), "tool_call_id": item.call_id})
            elif isinstance(item, FunctionCall):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                if not out or out[-1]["role"] != "assistant":
                    out.append({"role": "assistant", "content": ""})
                out[-1].setdefault("tool_calls", []).append(call)
        return out

    def chat_fields(self) -> dict:
        """The tools, tool_choice, parallel_tool_calls and response_format of the chat body."""
        fields: dict = {"parallel_tool_calls": self.parallel_tool_calls}
        if self.tools:
            fields["tools"] = [{"type": "function", "function": {
                "name": t.name, "description": t.description or "", "parameters": t.parameters}} for t in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            fields["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        else:
            fields["tool_choice"] = self.tool_choice
        if self.text is not None and self.text.format is not None:
            fields["response_format"] = self.text.format.response_format()
        return fields

    def echo(self) -> dict:
        """The tools, tool_choice, parallel_tool_calls and text fields of the response object."""
        tools = [{**t.model_dump(), "strict": t.strict is not False} for t in self.tools or []]
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedFunction) else (
            self.tool_choice or "auto")
        form = self.text.format if self.text is not None and self.text.format is not None else None
        return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": self.parallel_tool_calls is not False,
                "text": {"format": {"type": "text"} if form is None else form.model_dump(by_alias=True,
                                                                                       exclude_none=True)}}


SAMPLING = tuple(f.name for f in SCALAR_FIELDS if f.name in ResponseRequest.model_fields)
"""The numeric sampling fields a Responses request carries under their own names (its
``max_output_tokens`` is ``max_tokens``)."""
