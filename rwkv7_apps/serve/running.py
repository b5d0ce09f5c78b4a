"""Running a job on the scheduler (through the ``Service``): submit its requests, take their
events as they come, cancel them, and the error a failed choice stands for."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

from rwkv7_core.sampling import TokenLogprobs
from scheduler import ErrorCode, FinishReason, Request

from . import chat
from .job import Choice, Context, Job
from .logprobs import token_bytes
from .protocol import APIError
from .service import UNAVAILABLE, ServiceClosed, Token

ERROR_STATUS = {ErrorCode.INVALID_REQUEST: 400, ErrorCode.UNAVAILABLE: 503}
"""The HTTP status of a failed request by its error code; any other failure (the engine, the
model, the grammar) is the server's: 500."""
DISCONNECT_POLL_S = 0.25


async def submit(ctx: Context, job: Job,
                 groups: list[list[Request]]) -> tuple[asyncio.Queue, list[TokenLogprobs | None]]:
    """Queue the job's requests; score the prompts first when echo asks for logprobs."""
    scores: list[TokenLogprobs | None] = [None] * len(job.prompts)
    if job.echo and job.logprobs is not None:
        scores = [await ctx.service.score(p) if len(p) > 1 else None for p in job.prompts]
    queue: asyncio.Queue = asyncio.Queue()
    try:
        for group in groups:
            ctx.service.submit(group, shared_prompt=True, queue=queue)
    except ServiceClosed as e:
        cancel(ctx, job)
        raise APIError(503, f"{UNAVAILABLE}{e}") from None
    return queue, scores


def cancel(ctx: Context, job: Job) -> None:
    for c in job.choices:
        if c.output is None:
            ctx.service.cancel(c.request_id)


async def events(ctx: Context, job: Job, queue: asyncio.Queue
                 ) -> AsyncIterator[list[tuple[Choice, str, bool, Token | None]]]:
    """Batches of (choice, text delta, finished, the Token drawn or None): each batch is every
    event available at one wake-up (so a stream sends one write per step; one choice may have
    several tokens in it), until every choice is final (the scheduler finishes max_tokens=0
    choices at once, "length")."""
    by_id = {c.request_id: c for c in job.choices}
    pending = set(by_id)
    while pending:
        items = [await queue.get()]
        while not queue.empty():
            items.append(queue.get_nowait())
        batch = []
        for rid, event in items:
            choice = by_id[rid]
            if isinstance(event, Token):
                choice.tokens.append(event.id)
                if event.logprobs is not None:
                    choice.scores.append(event.logprobs)
                delta = choice.text.push(token_bytes(ctx, event.id))
                choice.content += delta
                batch.append((choice, delta, False, event))
            else:
                choice.output = event
                pending.discard(rid)
                delta = choice.text.finish()
                choice.content += delta
                if job.keeps_replies:
                    _remember_reply(ctx, job, choice)
                batch.append((choice, delta, True, None))
        yield batch


def _remember_reply(ctx: Context, job: Job, choice: Choice) -> None:
    """Keep a finished chat reply's generated ids (``chat.ReplyTokens``), so the next turn
    that sends it back continues from exactly what the model saw."""
    if choice.output.finish_reason not in (FinishReason.LENGTH, FinishReason.STOP):
        return
    ids = chat.reply_ids(ctx.tokenizer, choice.tokens, choice.content, choice.text.stopped)
    if ids is not None:
        ctx.replies.remember(job.prompts[choice.prompt_index], choice.content, ids)


def failure(choice: Choice) -> APIError | None:
    """The error a finished choice stands for (``ERROR_STATUS`` by its code), else None."""
    out = choice.output
    if out is None or out.finish_reason != FinishReason.ERROR:
        return None
    status = 500 if out.error_code is None else ERROR_STATUS.get(out.error_code, 500)
    return APIError(status, out.error or "request failed")


async def run_unless_disconnected(ctx: Context, job: Job, request, collect) -> bool:
    """Run ``collect()`` (a coroutine function that drains the job's events) to its end and
    re-raise what it raised; False, with the job's requests cancelled, when the client (a
    Starlette request) disconnects first (checked every DISCONNECT_POLL_S)."""
    task = asyncio.create_task(collect())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                return False
        task.result()
        return True
    finally:
        if not task.done():
            task.cancel()
            cancel(ctx, job)
