"""The FastAPI application: routes, auth, body-size limit and OpenAI-style errors.

Endpoints: POST /v1/completions, POST /v1/chat/completions, POST|GET|DELETE /v1/responses
(responses.py), GET /v1/models (these need the API key when one is set), GET|HEAD /health (200 once the model is loaded and compiled, 503
before, and while draining or after a failure, naming the reason), GET|HEAD /metrics
(Prometheus text). Handlers validate, enqueue and await events; the model runs in the
scheduler thread (service.py).
"""
from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rwkv7_core.text_checks import unpaired_surrogate
from scheduler import Request as SchedulerRequest

from . import build, render, running, structured
from .fields import UNSUPPORTED
from .job import Context, Job
from .metrics import CONTENT_TYPE, ServerMetrics
from .offload import off_loop
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from .request_ids import RequestIds
from .response_store import ResponseStore
from .responses import add_response_routes
from .service import UNAVAILABLE
from .streaming import sse

log = logging.getLogger("rwkv7_serve")


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is answered 413, by its
    Content-Length at once, or (chunked) once the body read so far passes the limit; the app
    gets the whole body, read before it runs."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await _too_large(self.max_bytes)(scope, receive, send)
        parts, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body ended
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if size > self.max_bytes:
                return await _too_large(self.max_bytes)(scope, receive, send)
            more = message.get("more_body", False)
        body = [{"type": "http.request", "body": b"".join(parts), "more_body": False}]

        async def replay():
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)


def _too_large(limit: int) -> JSONResponse:
    error = APIError(413, f"request body over the server's limit of {limit} bytes")
    return JSONResponse(error.body(), status_code=413)

Builder = Callable[[Context, Any], tuple[Job, list[list[SchedulerRequest]]]]
"""A job builder (build.py): a body -> its job and, per prompt, its scheduler requests."""


def create_app(ctx: Context, metrics: ServerMetrics, ready, api_key: str | None = None,
               max_body_bytes: int = 1 << 22, responses: ResponseStore | None = None,
               metrics_open: bool = False) -> RequestIds:
    """``ready()``: True once the model is loaded and compiled (before: 503); ``responses``:
    the store of the Responses API (default: ResponseStore's default bounds); ``metrics_open``:
    /metrics needs no API key (its prefix-cache counters are a side channel: closed by default)."""
    app = FastAPI(title="rwkv7-serve", docs_url=None, redoc_url=None, openapi_url=None)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')")

    def serving() -> None:
        outage = ctx.service.outage
        if outage is not None:
            raise APIError(503, UNAVAILABLE + outage.reason)
        if not ready():
            raise APIError(503, "the model is still loading or compiling; retry shortly")

    _add_error_handlers(app, metrics)
    _add_status_routes(app, ctx, metrics, ready, Depends(authorized), metrics_open)
    _add_tokenizer_routes(app, ctx, metrics, Depends(authorized))
    guarded = [Depends(authorized), Depends(serving)]

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(body: CompletionRequest, request: Request):
        return await _handle(ctx, metrics, body, request, build.completion_job)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _handle(ctx, metrics, body, request, build.chat_job)

    add_response_routes(app, ctx, responses if responses is not None else ResponseStore(), metrics, authorized,
                        serving)
    return RequestIds(BodyLimit(app, max_body_bytes))


def _add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error leaves as OpenAI's error body, counted by path and status."""
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError):
        metrics.count_http(request.url.path, e.status)
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        return await api_error(request, _validation_error(e))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        return await api_error(request, APIError(e.status_code, str(e.detail)))


def _add_status_routes(app: FastAPI, ctx: Context, metrics: ServerMetrics, ready, key, metrics_open: bool) -> None:
    """/health (no key needed: probes), /metrics (the key unless ``metrics_open``), /v1/models
    (``key``: the API-key dependency)."""
    started = int(time.time())  # /v1/models "created"

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        outage = ctx.service.outage
        if outage is not None:
            return JSONResponse({"status": outage.status, "reason": outage.reason}, status_code=503)
        if not ready():
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    @app.api_route("/metrics", methods=["GET", "HEAD"], dependencies=[] if metrics_open else [key])
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    def model() -> dict:
        return {"id": ctx.model_name, "object": "model", "created": started, "owned_by": "rwkv7-engine",
                "max_tokens_limit": ctx.limits.max_tokens_limit, "state_dtype": ctx.state_dtype,
                "sampling_defaults": ctx.defaults}

    @app.get("/v1/models", dependencies=[key])
    async def models():
        return {"object": "list", "data": [model()]}

    @app.get("/v1/models/{model_id:path}", dependencies=[key])
    async def one_model(model_id: str):
        if model_id != ctx.model_name:
            raise APIError(404, f"model {model_id!r} does not exist; this server serves {ctx.model_name!r}", "model")
        return model()

    @app.post("/v1/embeddings", dependencies=[key])
    async def embeddings():
        raise APIError(404, f"embeddings are not served: {ctx.model_name!r} is served for completions, chat "
                            "and responses only (an RWKV model has no embedding head trained for retrieval)",
                       "model")


def _add_tokenizer_routes(app: FastAPI, ctx: Context, metrics: ServerMetrics, key) -> None:
    """/tokenize, /tokenizer_info and /detokenize (vLLM's shapes; ``key``: the API-key dependency)."""
    @app.post("/tokenize", dependencies=[key])
    async def tokenize(body: TokenizeRequest, request: Request):
        def work() -> Response:
            _check_text(body)
            tokens = build.tokenize(ctx, body)
            head = json.dumps({"count": len(tokens), "max_model_len": ctx.limits.max_prompt_tokens})
            return Response(f'{head[:-1]}, "tokens": {_int_array(tokens)}}}', media_type="application/json")
        reply = await off_loop(work)
        metrics.count_http(request.url.path, 200)
        return reply

    @app.get("/tokenizer_info", dependencies=[key])
    async def tokenizer_info(request: Request):
        """lm-eval's remote tokenizer reads it, then uses /tokenize: the stop token 0 has no
        text, so no eos/bos string."""
        if ctx.tokenizer is None:
            raise APIError(400, f"text needs the World vocabulary; this model has {ctx.vocab_size} tokens")
        metrics.count_http(request.url.path, 200)
        return {"tokenizer_class": type(ctx.tokenizer).__name__, "eos_token": None, "bos_token": None,
                "pad_token": None, "model_max_length": ctx.limits.max_prompt_tokens}

    @app.post("/detokenize", dependencies=[key])
    async def detokenize(body: DetokenizeRequest, request: Request):
        text = build.detokenize(ctx, body)
        metrics.count_http(request.url.path, 200)
        return {"prompt": text}


def _int_array(values: list[int], piece: int = 1 << 16) -> str:
    """The JSON array of ``values``, written ``piece`` values per ``json.dumps`` call. A call holds
    the GIL throughout, and a 4 MB body's 600k ids in one call would hold it for tens of ms."""
    return "[" + ",".join(json.dumps(values[i:i + piece])[1:-1] for i in range(0, len(values), piece)) + "]"


def _validation_error(e: RequestValidationError) -> APIError:
    """A pydantic error as a 400 naming its field (dotted path, list indices in []); of a
    union's branch errors, the one that got deepest into the value."""
    err = max(e.errors(), key=lambda x: len(x.get("loc", ())))
    loc = [x for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {err.get('msg')}")
    # drop pydantic's union-branch names (e.g. 'str', 'list[int]') from the path
    loc = [x for x in loc if isinstance(x, int) or not any(c in str(x) for c in "[]") and x not in ("str", "int")]
    loc = [x for x in loc if not str(x).startswith(("function-", "tag:"))]  # validators', union tags
    param = ""
    for x in loc:
        param += f"[{x}]" if isinstance(x, int) else (f".{x}" if param else str(x))
    if err.get("type") == UNSUPPORTED:  # fields.py: the refused field inside the object at param
        field = err["ctx"]["field"]
        param = f"{param}.{field}" if param else field
        return APIError(400, f"{param}: not supported by this server ({err['ctx']['why']})", param)
    if err.get("type") == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param or None)
    if err.get("type") == "missing":
        return APIError(400, f"missing required field {param!r}", param or None)
    return APIError(400, f"{param or 'body'}: {err.get('msg')}", param or None)


def _check_text(body) -> None:
    """400 naming the field of the first unpaired surrogate in a body's strings."""
    surrogate = unpaired_surrogate(body.model_dump(exclude_none=True))
    if surrogate:
        raise APIError(400, surrogate.message(), surrogate.path or None)


def _checked_job(ctx: Context, body, builder: Builder):
    _check_text(body)
    return builder(ctx, body)


async def _handle(ctx: Context, metrics: ServerMetrics, body, request: Request, builder: Builder):
    """The three steps of a completion or chat: the body becomes a job (``builder``, off the
    event loop), the scheduler runs it, the job's renderer writes the reply or the stream."""
    await structured.compile_off_loop(ctx, body)  # a grammar compile never runs on the loop
    job, groups = await off_loop(_checked_job, ctx, body, builder)
    queue, prompt_scores = await running.submit(ctx, job, groups)
    if body.stream:
        metrics.count_http(request.url.path, 200)
        return StreamingResponse(_stream(ctx, job, queue, prompt_scores), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    texts: dict[int, str] = {}

    async def collect():
        async for batch in running.events(ctx, job, queue):
            for choice, delta, _, _ in batch:
                texts[choice.index] = texts.get(choice.index, "") + delta

    if not await running.run_unless_disconnected(ctx, job, request, collect):
        return Response(status_code=499)
    for choice in job.choices:
        error = running.failure(choice)
        if error is not None:
            raise error
    reply = await off_loop(lambda: JSONResponse(render.response(ctx, job, texts, prompt_scores)))
    metrics.count_http(request.url.path, 200)
    return reply


async def _stream(ctx: Context, job, queue, prompt_scores):
    """SSE chunks (one write per wake-up; a stream's chunks in order); a client disconnect
    cancels the generator, which cancels the requests."""
    try:
        async for batch in running.events(ctx, job, queue):
            parts = []
            for choice, delta, finished, token in batch:
                error = running.failure(choice) if finished else None
                if error is not None:
                    parts.append(sse(error.body()))
                else:
                    parts += render.stream_chunks(ctx, job, choice, delta, finished, prompt_scores, token)
            if parts:
                yield "".join(parts)
        options = job.body.stream_options
        if options is not None and options.include_usage:
            yield render.chunk(ctx, job, [], with_usage=True)
        yield sse("[DONE]")
    finally:
        running.cancel(ctx, job)
