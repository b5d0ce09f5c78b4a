"""RWKV World chat format: the prompt a list of chat messages renders to.

    System: You are terse.

    User: Hi

    Assistant: Hello!

    User: And now?

    Assistant:

Roles map to ``System`` (``system``, ``developer``), ``User``, ``Assistant``, ``Tool`` (a
tool's result; an assistant's tool calls are its turn's JSON, rwkv7_apps/serve/structured.py); turns are separated by a blank line; the
prompt ends with ``Assistant:`` for the model to continue, and generation stops at the next
``\\n\\nUser:``. Blank lines inside a message would read as a turn boundary, so runs of
newlines in message text collapse to one (as RWKV's own chat demos do).
"""
from __future__ import annotations

import re
from typing import Sequence

ROLE_NAMES = {"developer": "System", "system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}
TURN_STOP = "\n\nUser:"


def clean(text: str) -> str:
    """Message text with blank-line runs collapsed and surrounding whitespace stripped."""
    return re.sub(r"\n\s*\n", "\n", text.replace("\r\n", "\n")).strip()


def render(messages: Sequence[tuple[str, str]]) -> str:
    """Prompt text for (role, content) messages (roles: developer = system, user, assistant, tool)."""
    turns = [f"{ROLE_NAMES[role]}: {clean(content)}" for role, content in messages]
    return "\n\n".join(turns + ["Assistant:"])
