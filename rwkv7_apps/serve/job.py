"""What one HTTP completion or chat request becomes: a ``Job`` of ``Choice``s (one scheduler
request each) with the ``Renderer`` of its endpoint, and the ``Context`` the handlers share.

Choice ``i`` of a request (``i = prompt_index * n + k``) draws with seed ``seed + i`` when
the body has a ``seed`` (else one drawn by the server's generator, ``--seed``), so a choice
equals that seed run alone.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rwkv7_core.sampling import MAX_TOKENS_LIMIT, TokenLogprobs
from scheduler import RequestOutput

from . import chat, tool_calls
from .limits import DEFAULT_MAX_REPLY_ENTRIES
from .service import Service, Token
from .streaming import TextStream


@dataclass
class Limits:
    max_prompt_tokens: int
    max_waiting: int
    max_tokens_limit: int = MAX_TOKENS_LIMIT
    max_reply_entries: int = DEFAULT_MAX_REPLY_ENTRIES


@dataclass
class Context:
    """What handlers need besides the body."""
    service: Service
    model_name: str
    tokenizer: Any          # WorldTokenizer or None
    vocab_size: int
    defaults: dict          # sampling defaults (SamplingParams fields)
    limits: Limits
    seeds: np.random.Generator  # draws the seeds of requests that give none
    states: dict = field(default_factory=dict)  # named initial states: {name: rwkv7_apps.states.NamedState}
    replies: chat.ReplyTokens = field(default_factory=chat.ReplyTokens)  # generated ids of chat replies
    state_dtype: str = "float32"  # the engine's wkv state dtype (reported by /v1/models)


@dataclass
class Choice:
    index: int
    prompt_index: int
    request_id: str
    text: TextStream
    tokens: list[int] = field(default_factory=list)
    scores: list[TokenLogprobs] = field(default_factory=list)
    output: RequestOutput | None = None
    sent_role: bool = False
    content: str = ""          # the text sent so far
    logprobs_offset: int = 0   # text_offset of its next completion logprobs entry
    reader: tool_calls.CallReader | None = None  # a stream with tools: its text read as content or tool calls


class Renderer(Protocol):
    """How one endpoint writes a job's reply (render_chat.py, render_completion.py)."""
    object: str         # the response's "object"
    chunk_object: str   # a streamed chunk's "object"
    id_prefix: str      # the response id's prefix

    def choice(self, ctx: Context, job: Job, choice: Choice, text: str, prompt_scores: TokenLogprobs | None
               ) -> dict[str, Any]:
        """A finished choice's fields in the whole response (``text``: all it generated)."""

    def stream_item(self, ctx: Context, job: Job, choice: Choice, delta: str, finished: bool,
                    prompt_scores: TokenLogprobs | None, token: Token | None) -> tuple[list[dict], dict[str, Any], bool]:
        """One event of a stream: (the choice items to send first, this event's item without
        ``index``/``finish_reason``/``token_ids``, whether it carries anything)."""

    def finish_reason(self, job: Job, choice: Choice, text: str) -> str:
        """A finished choice's finish reason as the endpoint reports it."""


@dataclass
class Job:
    """A validated request: its prompts (token ids), choices and rendering options."""
    renderer: Renderer
    body: Any
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    choices: list[Choice]
    logprobs: int | None            # alternatives per token (None = no logprobs)
    echo: bool
    tools: tool_calls.ToolPlan | None = None  # a chat request's tools (answers read as tool calls)
    keeps_replies: bool = False     # a chat: finished replies are remembered for the next turn
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
