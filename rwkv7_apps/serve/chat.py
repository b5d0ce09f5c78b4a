"""RWKV World chat format: the prompt a list of chat messages renders to, and its token ids.

    System: You are terse.

    User: Hi

    Assistant: Hello!

    User: And now?

    Assistant:

Roles map to ``System`` (``system``, ``developer``), ``User``, ``Assistant``, ``Tool`` (a
tool's result; an assistant's tool calls are written into its turn in the tool-call format,
rwkv7_apps/serve/tool_calls.py); turns are separated by a blank line; the prompt ends
with ``Assistant:`` for the model to continue, and generation stops at the next
``\\n\\nUser:``. Blank lines inside a message would read as a turn boundary, so runs of
newlines in message text collapse to one (as RWKV's own chat demos do).

Token ids (``encode``) are built piece by piece so that a conversation's next turn begins
with exactly this turn's prompt ids followed by the ids of the reply the model generated:
the prefix cache then holds the state after them (scheduler ``turn_cache``) and the next
turn prefills only its new message. Text encoded whole would not keep that: the tokenizer
may merge across a message border, and a model's reply is often not the tokenizer's own
encoding of its text (``ReplyTokens`` remembers the generated ids).
"""
from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

ROLE_NAMES = {"developer": "System", "system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
TURN_STOP = "\n\nUser:"
SEPARATOR = "\n\n"
REPLY_TOKENS_KEPT = 1 << 22
"""Most generated token ids ``ReplyTokens`` keeps (16 MiB of ids), least recently used go first."""


def clean(text: str) -> str:
    """Message text with blank-line runs collapsed and surrounding whitespace stripped."""
    return re.sub(r"\n\s*\n", "\n", text.replace("\r\n", "\n")).strip()


def render(messages: Sequence[tuple[str, str]]) -> str:
    """Prompt text for (role, content) messages (roles: developer = system, user, assistant, tool)."""
    turns = [f"{ROLE_NAMES[role]}: {clean(content)}" for role, content in messages]
    return SEPARATOR.join(turns + ["Assistant:"])


def encode(tokenizer, messages: Sequence[tuple[str, str]], replies: "ReplyTokens | None" = None) -> list[int]:
    """Token ids of ``render(messages)``, each separator, role header (``"User:"``) and message
    text (``" " + clean(content)``) encoded apart, so the ids of a prefix of the messages
    (plus the final ``Assistant:``) are a prefix of the ids of the whole. An assistant
    message that ``replies`` holds (a reply this server generated after exactly the ids
    before it, with exactly this text) is the ids the model generated."""
    ids: list[int] = []
    for i, (role, content) in enumerate(messages):
        if i:
            ids += tokenizer.encode(SEPARATOR)
        ids += tokenizer.encode(f"{ROLE_NAMES[role]}:")
        generated = replies.get(ids, content) if replies is not None and role == "assistant" else None
        ids += generated if generated is not None else tokenizer.encode(f" {clean(content)}")
    if messages:
        ids += tokenizer.encode(SEPARATOR)
    return ids + tokenizer.encode("Assistant:")


def reply_ids(tokenizer, tokens: Sequence[int], text: str, stopped: bool) -> list[int] | None:
    """The generated ``tokens`` that a reply's sent ``text`` stands for: all of them, unless a
    stop string cut the text (``stopped``): then the shortest run of them whose bytes are
    exactly the text's (None when the cut fell inside a token)."""
    if not stopped:
        return list(tokens)
    want, got = text.encode("utf-8", "surrogatepass"), b""
    for k, token in enumerate(tokens):
        if got == want:
            return list(tokens[:k])
        got += tokenizer.decode_bytes([token])
        if not want.startswith(got):
            return None
    return list(tokens) if got == want else None


class ReplyTokens:
    """The token ids of replies this server generated, by (the prompt ids they followed,
    their text as sent): a client that sends the reply back in the next turn's messages gets
    the model's own ids, not the text encoded again. Bounded to ``max_tokens`` ids in all
    (least recently used first out); thread-safe."""

    def __init__(self, max_tokens: int = REPLY_TOKENS_KEPT):
        self.max_tokens, self.tokens = max_tokens, 0
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ids)

    def remember(self, prompt: Sequence[int], text: str, ids: Sequence[int]) -> None:
        key, ids = _key(prompt, text), tuple(ids)
        if not ids or len(ids) > self.max_tokens:
            return
        with self._lock:
            old = self._ids.pop(key, None)
            self.tokens += len(ids) - (0 if old is None else len(old))
            self._ids[key] = ids
            while self.tokens > self.max_tokens:
                self.tokens -= len(self._ids.popitem(last=False)[1])

    def get(self, prompt: Sequence[int], text: str) -> list[int] | None:
        key = _key(prompt, text)
        with self._lock:
            ids = self._ids.get(key)
            if ids is None:
                return None
            self._ids.move_to_end(key)
            return list(ids)


def _key(prompt: Sequence[int], text: str) -> str:
    digest = hashlib.sha256(np.asarray(prompt, np.int64).tobytes())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
