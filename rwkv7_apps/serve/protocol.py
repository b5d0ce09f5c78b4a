"""Request bodies of the OpenAI-compatible endpoints (pydantic), and the OpenAI-style error.

Unknown fields are rejected (``extra="forbid"``), so a typo or an unsupported OpenAI field is
a 400 naming it rather than silently ignored. Sampling fields a request omits take the
server's defaults (the command's sampling options). Extensions beyond OpenAI's fields:
``top_k``, ``penalty_decay``, ``stop_token_ids``, ``banned_token_ids``, ``return_token_ids``.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from rwkv7_core.sampling import DEVICE_INT_MAX, SEED_MAX, TOP_LOGPROBS

MAX_N = 64
TokenIds = list[StrictInt]


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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields shared by both endpoints (None = the server default)."""
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    max_tokens: int | None = Field(None, ge=0, le=DEVICE_INT_MAX)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=DEVICE_INT_MAX)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    penalty_decay: float | None = Field(None, gt=0, le=1)
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: TokenIds | None = None
    banned_token_ids: TokenIds | None = None
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    n: int = Field(1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    return_token_ids: StrictBool = False

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    prompt: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]
    echo: StrictBool = False
    logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: StrictStr
    name: StrictStr | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0, le=DEVICE_INT_MAX)
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)


def prompt_list(prompt) -> list[str | list[int]]:
    """A completion ``prompt`` as a list of prompts (each text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty", "prompt")
    if all(isinstance(t, int) for t in prompt):
        return [prompt]
    return list(prompt)
