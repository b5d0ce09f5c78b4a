"""The Responses API: ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``.

A response is one chat turn (World chat format, chat.py): ``instructions`` render as a
system turn before the ``input`` messages. With ``previous_response_id`` the prompt is the
stored response's whole token sequence (its prompt + output, exactly the tokens the model
consumed) followed by the new turns rendered by the same template (``continuation``), so
the state at the end of the stored turn is a prefix of the new prompt: the scheduler's
prefix cache and the replica set's affinity (scheduler/replicas/affinity.py) find it. The stored
conversation's initial state (``state``) carries over. ``store`` (default true) keeps the
response in the bounded store (response_store.py). Streaming sends OpenAI's semantic
events (``response.created`` ... ``response.output_text.delta`` ... ``response.completed``
or ``response.incomplete``), each as ``event: TYPE`` + ``data: JSON``.
"""
from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rwkv7_core.text_checks import unpaired_surrogate

from . import build, chat, render, running
from .job import Context, Job
from .protocol import APIError, ChatCompletionRequest
from .response_store import ResponseStore, StoredResponse
from .responses_protocol import SAMPLING, ResponseRequest


def add_response_routes(app: FastAPI, ctx: Context, store: ResponseStore, metrics, authorized, serving) -> None:
    """Register the routes on ``app`` (``authorized`` / ``serving``: the app's dependencies)."""

    @app.post("/v1/responses", dependencies=[Depends(authorized), Depends(serving)])
    async def create(body: ResponseRequest, request: Request):
        return await _create(ctx, store, metrics, body, request)

    @app.get("/v1/responses/{response_id}", dependencies=[Depends(authorized)])
    async def retrieve(response_id: str):
        item = _stored(store, response_id, "response_id")
        metrics.count_http("/v1/responses", 200)
        return item.body

    @app.delete("/v1/responses/{response_id}", dependencies=[Depends(authorized)])
    async def delete(response_id: str):
        _stored(store, response_id, "response_id")
        store.delete(response_id)
        metrics.count_http("/v1/responses", 200)
        return {"id": response_id, "object": "response", "deleted": True}


def _stored(store: ResponseStore, response_id: str, param: str) -> StoredResponse:
    item = store.get(response_id)
    if item is None:
        raise APIError(404, f"{param}: response {response_id!r} not found (never stored, deleted, or evicted "
                            "from the server's response store)", param)
    return item


# ----------------------------------------------------------------------------- prompt
def continuation(turns: list[tuple[str, str]], ends_at_user: bool) -> str:
    """The text that follows a stored turn's tokens: a turn separator and ``turns`` rendered
    as chat.render does; when the stored output already ended with ``\\n\\nUser:`` and the
    first new turn is the user's, that marker is not repeated."""
    text = chat.render(turns)
    if ends_at_user and turns[0][0] == "user":
        return text.removeprefix(chat.ROLE_NAMES["user"] + ":")
    return "\n\n" + text


def _prompt(ctx: Context, body: ResponseRequest, previous: StoredResponse | None) -> list[int]:
    if ctx.tokenizer is None:
        raise APIError(400, f"responses need the World vocabulary; this model has {ctx.vocab_size} tokens "
                            "(use /v1/completions with token-id prompts)", "input")
    turns = body.messages()
    if previous is None:
        return ctx.tokenizer.encode(chat.render(turns))
    return list(previous.tokens) + ctx.tokenizer.encode(continuation(turns, previous.ends_at_user))


def _job(ctx: Context, store: ResponseStore, body: ResponseRequest):
    """(job, its request groups, the stored response it continues or None); APIError."""
    if isinstance(body.input, list) and not body.input:
        raise APIError(400, "input: the input has no items", "input")
    previous, state = None, body.state
    if body.previous_response_id is not None:
        previous = _stored(store, body.previous_response_id, "previous_response_id")
        model = body.model or ctx.model_name
        if previous.model != model:
            raise APIError(400, f"previous_response_id: response {body.previous_response_id!r} was made by model "
                                f"{previous.model!r}; a conversation cannot go on with model {model!r}", "model")
        if state is not None and state != previous.state:
            raise APIError(400, f"state: the conversation of {body.previous_response_id!r} started from state "
                                f"{previous.state!r}; it cannot go on from {state!r}", "state")
        state = previous.state
    chat_body = ChatCompletionRequest(
        model=body.model, messages=[{"role": r, "content": t} for r, t in body.messages()],  # type: ignore[misc]
        max_tokens=body.max_output_tokens, seed=body.seed, state=state, cache_salt=body.cache_salt,
        prompt_cache_key=body.prompt_cache_key,
        **{name: getattr(body, name) for name in SAMPLING})
    tokens = _prompt(ctx, body, previous)
    if len(tokens) > ctx.limits.max_prompt_tokens:
        raise APIError(400, f"input: {len(tokens)} prompt tokens (the conversation so far included), more than "
                            f"the server's --max-prompt-tokens {ctx.limits.max_prompt_tokens}", "input")
    job, groups = build.chat_job(ctx, chat_body, chat_tokens=tokens)
    return job, groups, state


# ----------------------------------------------------------------------------- objects
def _object(ctx: Context, job: Job, body: ResponseRequest, status: str, text: str | None,
            error: APIError | None = None) -> dict[str, Any]:
    """The response object (``text`` None: no output yet; usage from ``render.usage``,
    the chat endpoints' counts: one prompt, one choice)."""
    output = []
    if text is not None:
        output.append(_message(job, "completed" if status == "completed" else "incomplete", text))
    counts = render.usage(job)
    return {
        "id": "resp_" + job.id, "object": "response", "created_at": job.created, "status": status,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "error": None if error is None else {"code": "server_error", "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "model": ctx.model_name, "output": output, "parallel_tool_calls": False,
        "previous_response_id": body.previous_response_id, "store": body.store,
        "temperature": body.temperature, "top_p": body.top_p, "text": {"format": {"type": "text"}},
        "tool_choice": "none", "tools": [], "truncation": "disabled", "metadata": body.metadata or {},
        "usage": None if text is None else {
            "input_tokens": counts["prompt_tokens"], "input_tokens_details": counts["prompt_tokens_details"],
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]},
    }


def _message(job: Job, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    return {"type": "message", "id": "msg_" + job.id, "status": status, "role": "assistant", "content": content}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(job: Job) -> str:
    return "incomplete" if render.finish_reason(job.choices[0]) == "length" else "completed"


def _keep(ctx: Context, store: ResponseStore, job: Job, body: ResponseRequest, state: str | None,
          obj: dict) -> None:
    """Store a finished response (``store``) with every token the model consumed."""
    if not body.store:
        return
    out = job.choices[0].output
    raw = ctx.tokenizer.decode_bytes(list(out.tokens))
    ends_at_user = raw.endswith(chat.TURN_STOP.encode())
    store.put(obj["id"], ctx.model_name, state, list(job.prompts[0]) + list(out.tokens), ends_at_user, obj)


# ----------------------------------------------------------------------------- handling
async def _create(ctx: Context, store: ResponseStore, metrics, body: ResponseRequest, request: Request):
    surrogate = unpaired_surrogate(body.model_dump(exclude_none=True))
    if surrogate:
        raise APIError(400, surrogate.message(), surrogate.path or None)
    job, groups, state = _job(ctx, store, body)
    queue, _ = await running.submit(ctx, job, groups)
    if body.stream:
        metrics.count_http("/v1/responses", 200)
        return StreamingResponse(_stream(ctx, store, job, body, state, queue), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    text = []

    async def collect():
        async for batch in running.events(ctx, job, queue):
            text.extend(delta for _, delta, _, _ in batch)

    if not await running.run_unless_disconnected(ctx, job, request, collect):
        return Response(status_code=499)
    error = running.failure(job.choices[0])
    if error is not None:
        raise error
    obj = _object(ctx, job, body, _status(job), "".join(text))
    _keep(ctx, store, job, body, state, obj)
    metrics.count_http("/v1/responses", 200)
    return JSONResponse(obj)


class _Events:
    """Numbers the streamed events (``sequence_number``) and frames them as SSE."""

    def __init__(self):
        self.n = 0

    def __call__(self, kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _stream(ctx: Context, store: ResponseStore, job: Job, body: ResponseRequest, state: str | None, queue):
    """The semantic events of one response; a client that goes away cancels it."""
    event, item = _Events(), {"item_id": "msg_" + job.id, "output_index": 0}
    text = []
    try:
        yield (event("response.created", response=_object(ctx, job, body, "in_progress", None))
               + event("response.in_progress", response=_object(ctx, job, body, "in_progress", None))
               + event("response.output_item.added", output_index=0, item=_message(job, "in_progress", None))
               + event("response.content_part.added", **item, content_index=0, part=_part("")))
        async for batch in running.events(ctx, job, queue):
            deltas = [delta for _, delta, _, _ in batch if delta]
            text += deltas
            if deltas:
                yield event("response.output_text.delta", **item, content_index=0, delta="".join(deltas), logprobs=[])
        error = running.failure(job.choices[0])
        if error is not None:
            yield event("error", code=str(error.status), message=error.message, param=None)
            yield event("response.failed", response=_object(ctx, job, body, "failed", None, error))
            return
        whole, status = "".join(text), _status(job)
        obj = _object(ctx, job, body, status, whole)
        _keep(ctx, store, job, body, state, obj)
        yield (event("response.output_text.done", **item, content_index=0, text=whole, logprobs=[])
               + event("response.content_part.done", **item, content_index=0, part=_part(whole))
               + event("response.output_item.done", output_index=0, item=obj["output"][0])
               + event(f"response.{status}", response=obj))
    finally:
        running.cancel(ctx, job)
