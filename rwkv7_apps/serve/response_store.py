"""The server's stored responses (``store: true`` of the Responses API), bounded.

A stored response keeps its JSON object (for ``GET /v1/responses/{id}``) and what a
continuation (``previous_response_id``) needs: the model, the named initial state, every
token the model consumed (prompt + output, int32) and whether the output ended with the
chat template's next-user marker. The response object is kept as its compact JSON text (a
bytes object), so what is counted is what is held: the store holds at most ``max_count``
responses and ``max_bytes`` bytes (4 per token + the JSON text + ``ENTRY_OVERHEAD`` for the
Python objects of an entry); the oldest go first. Used from the event loop only.
"""
from __future__ import annotations

import json
import logging
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger("rwkv7_serve")
DEFAULT_MAX_COUNT = 10_000
DEFAULT_MAX_MB = 256.0
ENTRY_OVERHEAD = 1024  # bytes: the entry's objects, its id and the dictionaries' slots


@dataclass
class StoredResponse:
    """``tokens``: the token ids the model consumed (prompt + output, a stop token excluded);
    ``ends_at_user``: the output ended with the template's ``\\n\\nUser:``; ``body_json``: the
    response object as served (compact UTF-8 JSON; ``body`` parses it); ``tools_text``: the
    system turn listing the tools that the tokens hold last (None: none)."""
    model: str
    state: str | None
    tokens: array
    ends_at_user: bool
    body_json: bytes
    tools_text: str | None = None

    @property
    def body(self) -> dict:
        return json.loads(self.body_json)

    @property
    def nbytes(self) -> int:
        return (self.tokens.itemsize * len(self.tokens) + len(self.body_json) + len(self.tools_text or "")
                + ENTRY_OVERHEAD)


class ResponseStore:
    """Stored responses by id, oldest evicted beyond ``max_count`` entries or ``max_bytes``."""

    def __init__(self, max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = int(DEFAULT_MAX_MB * 2**20)):
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self.nbytes = 0
        self.evicted = 0

    def put(self, response_id: str, model: str, state: str | None, tokens: Sequence[int], ends_at_user: bool,
            body: dict, tools_text: str | None = None) -> None:
        body_json = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        item = StoredResponse(model, state, array("i", tokens), ends_at_user, body_json, tools_text)
        size = item.nbytes
        if size > self.max_bytes:
            log.warning("response %s (%d bytes) is larger than the response store (%d bytes): not stored",
                        response_id, size, self.max_bytes)
            return
        self.delete(response_id)
        self._items[response_id], self._sizes[response_id] = item, size
        self.nbytes += size
        while len(self._items) > self.max_count or self.nbytes > self.max_bytes:
            oldest = next(iter(self._items))
            self.delete(oldest)
            self.evicted += 1

    def get(self, response_id: str) -> StoredResponse | None:
        return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response; False if it was not stored."""
        if self._items.pop(response_id, None) is None:
            return False
        self.nbytes -= self._sizes.pop(response_id)
        return True

    def __len__(self) -> int:
        return len(self._items)
