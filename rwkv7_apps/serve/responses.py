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

from . import build, chat, render, render_chat, running, structured
from .job import Context, Job
from .offload import off_loop
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


def _previous(store: ResponseStore, body: ResponseRequest, model: str) -> tuple[StoredResponse | None, str | None]:
    """The stored response a body continues (None) and the conversation's named state; 400/404."""
    if body.previous_response_id is None:
        return None, body.state
    previous = _stored(store, body.previous_response_id, "previous_response_id")
    if previous.model != model:
        raise APIError(400, f"previous_response_id: response {body.previous_response_id!r} was made by model "
                            f"{previous.model!r}; a conversation cannot go on with model {model!r}", "model")
    if body.state is not None and body.state != previous.state:
        raise APIError(400, f"state: the conversation of {body.previous_response_id!r} started from state "
                            f"{previous.state!r}; it cannot go on from {body.state!r}", "state")
    return previous, previous.state


def chat_body(body: ResponseRequest, state: str | None) -> ChatCompletionRequest:
    """The chat completion a Responses body asks for (its messages, tools and format)."""
    if isinstance(body.input, list) and not body.input:
        raise APIError(400, "input: the input has no items", "input")
    return ChatCompletionRequest(
        model=body.model, messages=body.messages(),  # type: ignore[arg-type]
        max_tokens=body.max_output_tokens, seed=body.seed, state=state, cache_salt=body.cache_salt,
        prompt_cache_key=body.prompt_cache_key, stream=body.stream,
        **body.chat_fields(), **{name: getattr(body, name) for name in SAMPLING})


CHAT_NAMES = (("response_format", "text.format"), (".function.", "."))
"""Where chat's field names in an error differ from the Responses API's (in order)."""


def responses_error(e: APIError) -> APIError:
    """A chat machinery error about a Responses body, naming the Responses fields."""
    if e.param not in ("response_format", "tools", "tool_choice"):
        return e
    message, param = e.message, e.param
    for chat_name, name in CHAT_NAMES:
        message = message.replace(chat_name, name)
        param = param.replace(chat_name, name)
    return APIError(e.status, message, param)


def _prompt(ctx: Context, chat_request: ChatCompletionRequest, previous: StoredResponse | None) -> list[int]:
    """The prompt ids: the turns (tools listed first in a system turn) rendered whole, or
    after the stored conversation's tokens (``continuation``)."""
    if ctx.tokenizer is None:
        raise APIError(400, f"responses need the World vocabulary; this model has {ctx.vocab_size} tokens "
                            "(use /v1/completions with token-id prompts)", "input")
    tools = tools_text(chat_request, previous)
    listed = tools is not None and (previous is None or tools != previous.tools_text)
    turns: list[tuple[str, str]] = [("system", tools)] if listed and tools is not None else []
    turns += [(m.role, structured.history_text(m)) for m in chat_request.messages]
    if previous is None:
        return ctx.tokenizer.encode(chat.render(turns))
    return list(previous.tokens) + ctx.tokenizer.encode(continuation(turns, previous.ends_at_user))


def tools_text(chat_request: ChatCompletionRequest, previous: StoredResponse | None) -> str | None:
    """The system turn that lists the request's tools (tool_calls.py), which the prompt holds
    last: a continuation lists them again only when they differ from the conversation's."""
    plan = structured.tool_plan(chat_request)
    if plan is None:
        return None if previous is None else previous.tools_text
    return plan.system_text()


def _job(ctx: Context, chat_request: ChatCompletionRequest, previous: StoredResponse | None):
    """The job and its request groups (off the event loop); APIError."""
    tokens = _prompt(ctx, chat_request, previous)
    if len(tokens) > ctx.limits.max_prompt_tokens:
        raise APIError(400, f"input: {len(tokens)} prompt tokens (the conversation so far included), more than "
                            f"the server's --max-prompt-tokens {ctx.limits.max_prompt_tokens}", "input")
    return build.chat_job(ctx, chat_request, chat_tokens=tokens)


# ----------------------------------------------------------------------------- objects
def _object(ctx: Context, job: Job, body: ResponseRequest, status: str, output: list[dict] | None,
            error: APIError | None = None) -> dict[str, Any]:
    """The response object (``output`` None: no output yet; usage from ``render.usage``,
    the chat endpoints' counts: one prompt, one choice)."""
    counts = render.usage(job)
    return {
        "id": "resp_" + job.id, "object": "response", "created_at": job.created, "status": status,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "error": None if error is None else {"code": "server_error", "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "model": ctx.model_name, "output": output or [],
        "previous_response_id": body.previous_response_id, "store": body.store,
        "temperature": body.temperature, "top_p": body.top_p, **body.echo(),
        "truncation": "disabled", "metadata": body.metadata or {},
        "usage": None if output is None else {
            "input_tokens": counts["prompt_tokens"], "input_tokens_details": counts["prompt_tokens_details"],
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]},
    }


def _output(job: Job, status: str, text: str) -> list[dict]:
    """The output items of a finished answer: its message (unless it is only tool calls), then
    one ``function_call`` item per call (tool_calls.py reads them from the text)."""
    message, _ = render_chat.answer(job, job.choices[0], text)
    calls = message.get("tool_calls") or []
    items = [] if calls and not message["content"] else [_message(job, status, message["content"] or "")]
    items += [_call(c["id"], c["function"]["name"], c["function"]["arguments"], "completed") for c in calls]
    if calls and status == "incomplete":
        items[-1]["status"] = "incomplete"  # the call max_output_tokens cut
    return items


def _message(job: Job, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    return {"type": "message", "id": "msg_" + job.id, "status": status, "role": "assistant", "content": content}


def _call(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"), "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(job: Job) -> str:
    return "incomplete" if render.finish_reason(job.choices[0]) == "length" else "completed"


def _keep(ctx: Context, store: ResponseStore, job: Job, body: ResponseRequest, state: str | None,
          obj: dict, tools: str | None) -> None:
    """Store a finished response (``store``) with every token the model consumed and the
    tools' system turn its prompt holds last (``tools``)."""
    if not body.store:
        return
    out = job.choices[0].output
    raw = ctx.tokenizer.decode_bytes(list(out.tokens))
    ends_at_user = raw.endswith(chat.TURN_STOP.encode())
    store.put(obj["id"], ctx.model_name, state, list(job.prompts[0]) + list(out.tokens), ends_at_user, obj, tools)


# ----------------------------------------------------------------------------- handling
async def _create(ctx: Context, store: ResponseStore, metrics, body: ResponseRequest, request: Request):
    surrogate = unpaired_surrogate(body.model_dump(exclude_none=True))
    if surrogate:
        raise APIError(400, surrogate.message(), surrogate.path or None)
    model = body.model or ctx.model_name
    previous, state = _previous(store, body, model)
    try:
        chat_request = chat_body(body, state)
        await structured.compile_off_loop(ctx, chat_request)  # a grammar compile never runs on the loop
        job, groups = await off_loop(_job, ctx, chat_request, previous)
        tools = tools_text(chat_request, previous)
    except APIError as e:
        raise responses_error(e) from None
    queue, _ = await running.submit(ctx, job, groups)
    if body.stream:
        metrics.count_http("/v1/responses", 200)
        return StreamingResponse(_stream(ctx, store, job, body, (state, tools), queue), media_type="text/event-stream",
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
    status = _status(job)
    obj = _object(ctx, job, body, status, _output(job, status, "".join(text)))
    _keep(ctx, store, job, body, state, obj, tools)
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


class _StreamedOutput:
    """The output items of a streamed answer as they open: the message at its first text,
    each function call at its first delta (tool_calls.py's reader splits the text), each
    with OpenAI's added / delta / done events."""

    def __init__(self, job: Job, event: _Events):
        self.job, self.event = job, event
        self.reader = job.choices[0].reader  # None: no tools, all text is the message's
        self.text = ""
        self.message_index: int | None = None
        self.calls: dict[int, tuple[int, dict]] = {}  # call index -> (output index, item)
        self.count = 0

    def _open_message(self) -> str:
        self.message_index, self.count = self.count, self.count + 1
        return (self.event("response.output_item.added", output_index=self.message_index,
                           item=_message(self.job, "in_progress", None))
                + self.event("response.content_part.added", **self._where(), content_index=0, part=_part("")))

    def _where(self) -> dict:
        return {"item_id": "msg_" + self.job.id, "output_index": self.message_index}

    def feed(self, delta: str, finished: bool) -> str:
        calls: list = []
        if self.reader is not None:
            delta, calls = self.reader.feed(delta)
            if finished:
                delta += self.reader.finish()
        out = ""
        if delta:
            if self.message_index is None:
                out += self._open_message()
            self.text += delta
            out += self.event("response.output_text.delta", **self._where(), content_index=0, delta=delta, logprobs=[])
        for c in calls:
            if "id" in c:
                item = _call(c["id"], c["function"]["name"], "", "in_progress")
                self.calls[c["index"]] = (self.count, item)
                self.count += 1
                out += self.event("response.output_item.added", output_index=self.calls[c["index"]][0], item=item)
            index, item = self.calls[c["index"]]
            piece = c["function"].get("arguments", "")
            if piece:
                item["arguments"] += piece
                out += self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                                  delta=piece)
        return out

    def close(self, status: str) -> tuple[str, list[dict]]:
        """The done events of every item, and the output (an answer with no text and no call
        still has its empty message)."""
        out = ""
        if self.message_index is None and not self.calls:
            out += self._open_message()
        items: list[tuple[int, dict]] = []
        if self.message_index is not None:
            message = _message(self.job, "completed" if status == "completed" else "incomplete", self.text)
            out += (self.event("response.output_text.done", **self._where(), content_index=0, text=self.text,
                               logprobs=[])
                    + self.event("response.content_part.done", **self._where(), content_index=0,
                                 part=_part(self.text))
                    + self.event("response.output_item.done", output_index=self.message_index, item=message))
            items.append((self.message_index, message))
        for index, item in self.calls.values():
            item["status"] = "completed" if status == "completed" or index < self.count - 1 else "incomplete"
            out += (self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=item["arguments"])
                    + self.event("response.output_item.done", output_index=index, item=item))
            items.append((index, item))
        return out, [item for _, item in sorted(items, key=lambda x: x[0])]


async def _stream(ctx: Context, store: ResponseStore, job: Job, body: ResponseRequest,
                  conversation: tuple[str | None, str | None], queue):
    """The semantic events of one response (``conversation``: its named state and tools'
    system turn, as stored); a client that goes away cancels it."""
    event = _Events()
    output = _StreamedOutput(job, event)
    try:
        yield (event("response.created", response=_object(ctx, job, body, "in_progress", None))
               + event("response.in_progress", response=_object(ctx, job, body, "in_progress", None)))
        async for batch in running.events(ctx, job, queue):
            parts = "".join(output.feed(delta, finished) for _, delta, finished, _ in batch)
            if parts:
                yield parts
        error = running.failure(job.choices[0])
        if error is not None:
            yield event("error", code=str(error.status), message=error.message, param=None)
            yield event("response.failed", response=_object(ctx, job, body, "failed", None, error))
            return
        status = _status(job)
        done, items = output.close(status)
        obj = _object(ctx, job, body, status, items)
        _keep(ctx, store, job, body, *conversation[:1], obj, conversation[1])
        yield done + event(f"response.{status}", response=obj)
    finally:
        running.cancel(ctx, job)
