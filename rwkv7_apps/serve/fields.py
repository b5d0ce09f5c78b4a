"""The field policy of every request body, in one table: a field of OpenAI's request schemas
is honoured (a field of the body's pydantic model), accepted and ignored (``IGNORED``: no
meaning here; dropped before validation), or refused (``REFUSED``: a 400 that names it and
says "not supported", unless its value is one of the no-op values listed with it, e.g.
``best_of: 1``). A field given as ``null`` is absent (OpenAI's SDK objects sent back carry
nulls for what they lack). Anything else is an unknown field: a 400 naming it.

``PolicyModel`` applies the table of its subclass (``POLICY``) before pydantic validates the
body; docs/server.md has the table in words, and the tests check it against the openai
SDK's request types.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

UNSUPPORTED = "unsupported_field"
"""The pydantic error type of a refused field (app.py turns it into the 400)."""


@dataclass(frozen=True)
class Policy:
    """``ignored``: fields accepted with no effect; ``refused``: field -> (the values accepted
    as no-ops, why it is refused)."""
    ignored: frozenset[str] = frozenset()
    refused: dict[str, tuple[tuple[Any, ...], str]] = field(default_factory=dict)

    def apply(self, data: Any) -> Any:
        """``data`` (a request object) without its null and ignored fields; raises the
        UNSUPPORTED error naming a refused field with another value."""
        if not isinstance(data, dict):
            return data
        kept = {}
        for name, value in data.items():
            if value is None or name in self.ignored:
                continue
            if name in self.refused:
                allowed, why = self.refused[name]
                if value in allowed:
                    continue
                raise PydanticCustomError(UNSUPPORTED, "{field}: not supported by this server ({why})",
                                          {"field": name, "why": why})
            kept[name] = value
        return kept


class PolicyModel(BaseModel):
    """A request object under its class's ``POLICY`` (unknown fields: 400)."""
    model_config = ConfigDict(extra="forbid")
    POLICY: ClassVar[Policy] = Policy()

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return cls.POLICY.apply(data)


NO_TOOLS_OF_THAT_KIND = "only function tools are served"
COMMON = Policy(
    ignored=frozenset({"store", "service_tier", "user", "safety_identifier", "prompt_cache_retention",
                       "prompt_cache_options"}),
    refused={"moderation": ((), "no moderation is run")})
"""Fields every generating endpoint treats alike."""

COMPLETIONS = Policy(COMMON.ignored, {**COMMON.refused,
                                      "best_of": ((1,), "one candidate per choice; use n"),
                                      "suffix": (("",), "no fill-in-the-middle")})
CHAT = Policy(
    COMMON.ignored | {"reasoning_effort", "verbosity"},
    {**COMMON.refused,
     "audio": ((), "text output only"),
     "modalities": ((["text"],), "text output only"),
     "functions": ((), "the deprecated functions API; send tools"),
     "function_call": ((), "the deprecated functions API; send tool_choice"),
     "prediction": ((), "no predicted outputs"),
     "web_search_options": ((), NO_TOOLS_OF_THAT_KIND)})
RESPONSES = Policy(
    (COMMON.ignored - {"store"}) | {"reasoning", "include"},
    {**COMMON.refused,
     "background": ((False,), "responses run in the foreground"),
     "background_options": ((), "responses run in the foreground"),
     "conversation": ((), "send previous_response_id or the whole input"),
     "prompt": ((), "no stored prompt templates"),
     "context_management": ((), "the history is never compacted"),
     "max_tool_calls": ((), "no built-in tools"),
     "top_logprobs": ((0,), "no logprobs on the Responses API; use chat completions"),
     "image": ((), "text only"),
     "access_programs": ((), NO_TOOLS_OF_THAT_KIND)})
ASSISTANT_SENT_BACK = Policy(
    frozenset({"refusal", "annotations", "reasoning_content", "reasoning"}),
    {"audio": ((), "text output only"), "function_call": ((), "the deprecated functions API; send tool_calls")})
"""A chat message: what SDK objects of earlier assistant turns carry besides the text."""
