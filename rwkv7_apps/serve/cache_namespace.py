"""Which prefix-cache namespace a request's prompt may use (the cache as a side channel).

The prefix cache (and the turn cache) make a prompt that shares a prefix with an earlier one
faster, and ``usage.prompt_tokens_details.cached_tokens`` says how many tokens were shared: a
client can thereby test whether some other client sent a given text (or got a given reply).
A request's ``cache_salt`` (vLLM's name) and ``prompt_cache_key`` (OpenAI's) put its prompt in
a namespace of their own: it then shares cached prefixes, and reports cached tokens, only
with requests that send the same values. Without either it uses the shared namespace.
"""
from __future__ import annotations

import json
from typing import Annotated

from pydantic import StrictStr, StringConstraints

MAX_SALT_CHARS = 256
CacheSalt = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_SALT_CHARS)]


def request_salt(body) -> str:
    """The scheduler ``Request.cache_salt`` of a request body with ``cache_salt`` and
    ``prompt_cache_key`` fields ("" when it has neither: the shared namespace)."""
    salt, key = body.cache_salt, body.prompt_cache_key
    return "" if salt is None and key is None else json.dumps([salt, key])
