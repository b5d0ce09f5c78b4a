"""The ``/v1/chat/completions`` reply: an assistant message (with tools, its text read in the
tool-call format, tool_calls.py), streamed as deltas after a role chunk, and chat logprobs."""
from __future__ import annotations

from typing import Any

from rwkv7_core.sampling import TokenLogprobs

from .job import Choice, Context, Job
from .logprobs import chat_logprobs, drawn
from .render import finish_reason
from .service import Token


class ChatRenderer:
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def choice(self, ctx: Context, job: Job, choice: Choice, text: str, prompt_scores: TokenLogprobs | None
               ) -> dict[str, Any]:
        message, reason = answer(job, choice, text)
        return {"finish_reason": reason, "message": {"role": "assistant", **message},
                "logprobs": chat_logprobs(ctx, job, choice.tokens, choice.scores) if job.logprobs is not None else None}

    def stream_item(self, ctx: Context, job: Job, choice: Choice, delta: str, finished: bool,
                    prompt_scores: TokenLogprobs | None, token: Token | None) -> tuple[list[dict], dict[str, Any], bool]:
        first = []
        if not choice.sent_role:
            choice.sent_role = True
            first.append({"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None})
        calls: list = []
        if choice.reader is not None:  # text as it comes, tool calls once the marker is written
            delta, calls = choice.reader.feed(delta)
            if finished:
                delta += choice.reader.finish()
        fields: dict[str, Any] = {"delta": {"content": delta} if delta else {}}
        if calls:
            fields["delta"]["tool_calls"] = calls
        tokens, scores = drawn(job, token)
        fields["logprobs"] = chat_logprobs(ctx, job, tokens, scores) if scores else None
        return first, fields, bool(delta or calls or scores)

    def finish_reason(self, job: Job, choice: Choice, text: str) -> str:
        return answer(job, choice, text)[1]


def answer(job: Job, choice: Choice, text: str) -> tuple[dict, str]:
    """A finished chat choice's message fields and finish reason: with tools, its text read
    in the tool-call format (tool_calls.py): "tool_calls" when it stopped after whole calls."""
    reason = finish_reason(choice)
    if job.tools is None:
        return {"content": text}, reason
    reader = choice.reader
    if reader is None:
        reader = job.tools.reader()
        reader.feed(text)
        reader.finish()
    message = reader.message()
    return message, "tool_calls" if "tool_calls" in message and reason == "stop" and reader.complete else reason
