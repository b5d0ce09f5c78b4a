"""Request bodies of the OpenAI-compatible endpoints (pydantic), and the OpenAI-style error.

The field policy is fields.py's table (docs/server.md has it in words): what we can do is
honoured (a field below); OpenAI fields with no meaning here are accepted and ignored (the
table's, or marked IGNORED below where they are still bounded); refused fields and unknown
fields (typos included) are a 400 naming the field, never silently dropped; null = absent.
Sampling fields a request omits take the server's defaults (the command's sampling options).
Extensions beyond OpenAI's fields: ``top_k``, ``penalty_decay``, ``stop_token_ids``,
``banned_token_ids``, ``return_token_ids``, ``state``, and vLLM's ``ignore_eos``,
``stream_options.continuous_usage_stats`` and structured-output fields (``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``, ``structured_outputs``; structured.py).
"""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, StrictBool, StrictInt, StrictStr

from rwkv7_core.sampling import DEVICE_INT_MAX, SCALAR_FIELDS, SEED_MAX, TOP_LOGPROBS

from .cache_namespace import CacheSalt
from .fields import ASSISTANT_SENT_BACK, CHAT, COMMON, COMPLETIONS, Policy, PolicyModel
from .limits import Metadata

MAX_N = 64
TokenIds = list[StrictInt]
BAN = -100.0
"""The one ``logit_bias`` value served: -100 bans the token (other biases need a per-row
bias vector on the device, which the sampler does not have)."""


def sampling_field(name: str) -> Any:
    """The request field of the numeric sampling field ``name`` (its bounds and help from
    ``rwkv7_core.sampling.SCALAR_FIELDS``); None = the server's default."""
    spec = next(f for f in SCALAR_FIELDS if f.name == name)
    return Field(None, description=spec.help, ge=spec.ge, gt=spec.gt, le=spec.le)


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        kind = self.TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind,
                          "param": self.param, "code": self.status}}


class StreamOptions(PolicyModel):
    include_usage: StrictBool = False            # a last chunk with the usage
    continuous_usage_stats: StrictBool = False   # the usage so far in every chunk
    include_obfuscation: StrictBool | None = None  # IGNORED: no obfuscation padding is sent


class SamplingFields(PolicyModel):
    """Fields shared by both endpoints (None = the server default)."""
    POLICY = COMMON

    model: StrictStr | None = None
    cache_salt: CacheSalt | None = None        # a prefix-cache namespace of its own (cache_namespace.py)
    prompt_cache_key: CacheSalt | None = None  # the same, OpenAI's name
    max_tokens: int | None = sampling_field("max_tokens")
    temperature: float | None = sampling_field("temperature")
    top_p: float | None = sampling_field("top_p")
    top_k: int | None = sampling_field("top_k")
    presence_penalty: float | None = sampling_field("presence_penalty")
    frequency_penalty: float | None = sampling_field("frequency_penalty")
    penalty_decay: float | None = sampling_field("penalty_decay")
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: TokenIds | None = None
    banned_token_ids: TokenIds | None = None
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False
    state: StrictStr | None = None  # a named initial state (rwkv7-serve --state NAME=FILE)
    ignore_eos: StrictBool = False  # the default stop tokens do not end the output (stop_token_ids do)
    logit_bias: dict[StrictStr, float] | None = None  # BAN values only
    response_format: dict | None = None  # text, json_object, json_schema (structured.py)
    guided_json: dict | StrictStr | None = None      # older vLLM: a JSON schema
    guided_regex: StrictStr | None = None            # older vLLM: a regex
    guided_choice: list[StrictStr] | None = None     # older vLLM: one of these strings
    guided_grammar: StrictStr | None = None          # older vLLM: a Lark grammar (llguidance dialect)
    structured_outputs: dict | None = None           # vLLM's StructuredOutputsParams (structured.py)
    metadata: Metadata | None = None  # IGNORED (bounded as OpenAI bounds it)

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    POLICY = COMPLETIONS
    prompt: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]
    echo: StrictBool = False
    logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)


class TextPart(PolicyModel):
    """A text content part (other part types: 400 naming ``type``)."""
    POLICY = Policy(refused={"type": (("text",), "text content only")})
    type: Literal["text"] = "text"
    text: StrictStr


class ChatMessage(PolicyModel):
    """A chat message; ``developer`` is OpenAI's newer name of ``system``; ``content`` is text
    or a list of text parts (joined as they are); an assistant turn may hold ``tool_calls``
    (then content may be null), a ``tool`` turn is a tool's result for ``tool_call_id``; what
    SDK objects of earlier turns carry besides is ASSISTANT_SENT_BACK's (fields.py)."""
    POLICY = ASSISTANT_SENT_BACK
    role: Literal["developer", "system", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: StrictStr | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    POLICY = CHAT
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict] | None = None                  # [{"type": "function", "function": {...}}]
    tool_choice: StrictStr | dict | None = None      # "auto" | "none" | "required" | {"type": "function", ...}
    parallel_tool_calls: StrictBool | None = None    # several calls in one answer (default true)
    max_completion_tokens: int | None = Field(None, ge=0, le=DEVICE_INT_MAX)
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)


class TokenizeRequest(PolicyModel):
    """``/tokenize`` (vLLM's shape): a text ``prompt``, or chat ``messages`` rendered as
    chat completions render them."""
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True  # accepted: the World tokenizer adds none


class DetokenizeRequest(PolicyModel):
    """``/detokenize`` (vLLM's shape): token ids -> text."""
    model: StrictStr | None = None
    tokens: TokenIds


def prompt_list(prompt) -> list[str | list[int]]:
    """A completion ``prompt`` as a list of prompts (each text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty", "prompt")
    if all(isinstance(t, int) for t in prompt):
        return [prompt]
    return list(prompt)
