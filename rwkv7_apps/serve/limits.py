"""Bounds on what one request may make the server hold.

``Metadata``: a request's ``metadata`` as OpenAI bounds it (at most 16 pairs, keys of at most
64 characters, values of at most 512), so a stored response cannot carry an unbounded object.

``reply_entries``: the size of a reply, counted before any work starts, in token entries: each
choice carries its echoed prompt (with ``echo``) and up to ``max_tokens`` generated tokens, and
each of those carries ``1 + top logprobs`` entries when logprobs are asked for (an entry is
some 40 bytes of JSON). The server refuses a request over ``--max-reply-entries`` with a 400
naming it, so a small body (``echo`` + ``logprobs`` on long prompts, times ``n``) cannot make
it build replies of many gigabytes.
"""
from __future__ import annotations

from typing import Annotated, Sequence

from pydantic import Field, StrictStr, StringConstraints

METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512

Metadata = Annotated[dict[Annotated[StrictStr, StringConstraints(max_length=METADATA_KEY_CHARS)],
                          Annotated[StrictStr, StringConstraints(max_length=METADATA_VALUE_CHARS)]],
                     Field(max_length=METADATA_PAIRS)]
DEFAULT_MAX_REPLY_ENTRIES = 2_000_000


def reply_entries(prompt_lengths: Sequence[int], n: int, echo: bool, max_tokens: int, logprobs: int | None) -> int:
    """Token entries of the largest reply a request can get (see the module docstring)."""
    tokens = sum(n * ((length if echo else 0) + max_tokens) for length in prompt_lengths)
    return tokens * (1 + (logprobs or 0) if logprobs is not None else 1)
