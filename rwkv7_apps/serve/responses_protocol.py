"""Request body of ``POST /v1/responses`` (pydantic), with the field policy of protocol.py:
what we can do is honoured, OpenAI fields with no meaning here are accepted and ignored
(IGNORED), values we cannot honour and unknown fields are a 400 naming the field.
Extensions: ``top_k``, ``seed``, ``state`` (a named initial state)."""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from rwkv7_core.sampling import SCALAR_FIELDS, SEED_MAX

from .cache_namespace import CacheSalt
from .limits import Metadata
from .protocol import sampling_field


class InputText(BaseModel):
    """A text content part (``input_text`` of user/system turns, ``output_text`` of earlier
    assistant output sent back)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text", "text"]
    text: StrictStr
    annotations: list | None = None  # IGNORED (output_text sent back)
    logprobs: list | None = None     # IGNORED (output_text sent back)


class InputMessage(BaseModel):
    """An input item: a message (``type`` "message" or absent). Output messages of an
    earlier response may be sent back as they are (``id``, ``status`` IGNORED)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[StrictStr, list[InputText]]
    id: StrictStr | None = None      # IGNORED
    status: StrictStr | None = None  # IGNORED
    phase: StrictStr | None = None   # IGNORED

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class TextOptions(BaseModel):
    """``text``: plain text output only (structured output is not served here)."""
    model_config = ConfigDict(extra="forbid")
    format: TextFormat | None = None
    verbosity: StrictStr | None = None  # IGNORED


class ResponsesStreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_obfuscation: StrictBool | None = None  # IGNORED: no obfuscation padding is sent


class ResponseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    input: Union[StrictStr, list[InputMessage]]
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
    tools: list[dict] | None = Field(None, max_length=0)  # none served
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: StrictBool | None = None   # IGNORED (no tools are served)
    truncation: Literal["disabled"] | None = None   # the history is never truncated
    metadata: Metadata | None = None  # kept with the response (bounded as OpenAI bounds it)
    user: StrictStr | None = None                   # IGNORED
    safety_identifier: StrictStr | None = None      # IGNORED
    prompt_cache_key: CacheSalt | None = None       # a prefix-cache namespace of its own
    cache_salt: CacheSalt | None = None             # the same, vLLM's name
    service_tier: StrictStr | None = None           # IGNORED
    reasoning: dict | None = None                   # IGNORED (no reasoning effort setting)
    include: list[StrictStr] | None = Field(None, max_length=0)
    background: Literal[False] | None = None

    def messages(self) -> list[tuple[str, str]]:
        """(role, text) of the instructions (as a system turn) and the input."""
        turns = [("system", self.instructions)] if self.instructions is not None else []
        if isinstance(self.input, str):
            return turns + [("user", self.input)]
        return turns + [(m.role, m.text()) for m in self.input]


SAMPLING = tuple(f.name for f in SCALAR_FIELDS if f.name in ResponseRequest.model_fields)
"""The numeric sampling fields a Responses request carries under their own names (its
``max_output_tokens`` is ``max_tokens``)."""
