"""Writing a job's reply: the whole response or the chunks of a stream, the parts every
endpoint shares; what differs per endpoint is the job's ``Renderer``
(render_completion.py, render_chat.py)."""
from __future__ import annotations

from typing import Any

from rwkv7_core.sampling import TokenLogprobs

from .job import Choice, Context, Job
from .service import Token
from .streaming import sse


def finish_reason(choice: Choice) -> str:
    """A finished choice's reason: "stop" when a stop string ended its text, else the scheduler's."""
    return "stop" if choice.text.stopped else choice.output.finish_reason


def usage(job: Job) -> dict:
    """Token counts; ``prompt_tokens_details.cached_tokens``: prompt tokens the prefix cache
    served (each prompt counted once, however many choices share it)."""
    prompt = sum(len(p) for p in job.prompts)
    completion = sum(len(c.tokens) for c in job.choices)
    cached = {c.prompt_index: c.output.cached_tokens for c in job.choices if c.output is not None}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}


def response(ctx: Context, job: Job, texts: dict[int, str], prompt_scores: list[TokenLogprobs | None]) -> dict:
    """The whole (non-streamed) response body."""
    choices = []
    for c in job.choices:
        item: dict[str, Any] = {"index": c.index, "finish_reason": None}
        item.update(job.renderer.choice(ctx, job, c, texts[c.index], prompt_scores[c.prompt_index]))
        if job.body.return_token_ids:
            item["token_ids"] = list(c.tokens)
        choices.append(item)
    return {"id": job.renderer.id_prefix + job.id, "object": job.renderer.object, "created": job.created,
            "model": ctx.model_name, "choices": choices, "usage": usage(job)}


def chunk(ctx: Context, job: Job, choices: list[dict], with_usage: bool = False) -> str:
    """One SSE chunk of a streamed response; with the usage so far when asked (the last chunk
    of ``include_usage``) or in every chunk (``continuous_usage_stats``)."""
    options = job.body.stream_options
    with_usage = with_usage or (options is not None and options.continuous_usage_stats)
    body = {"id": job.renderer.id_prefix + job.id, "object": job.renderer.chunk_object, "created": job.created,
            "model": ctx.model_name, "choices": choices}
    if with_usage:
        body["usage"] = usage(job)
    return sse(body)


def stream_chunks(ctx: Context, job: Job, choice: Choice, delta: str, finished: bool,
                  prompt_scores: list[TokenLogprobs | None], token: Token | None = None) -> list[str]:
    """SSE chunks for one event of a streamed response (``token``: the one this event drew)."""
    first, fields, carries = job.renderer.stream_item(ctx, job, choice, delta, finished,
                                                      prompt_scores[choice.prompt_index], token)
    chunks = [chunk(ctx, job, [item]) for item in first]
    item: dict[str, Any] = {"index": choice.index, **fields,
                            "finish_reason": job.renderer.finish_reason(job, choice, "") if finished else None}
    if job.body.return_token_ids:
        item["token_ids"] = [token.id] if token is not None else []
    if finished or carries or job.body.return_token_ids:
        chunks.append(chunk(ctx, job, [item]))
    return chunks
