"""One HTTP completion or chat request as scheduler work: validate and tokenize it into
``Choice``s (one scheduler request each), then render the events as OpenAI responses,
whole or as streamed chunks.

Choice ``i`` of a request (``i = prompt_index * n + k``) draws with seed ``seed + i`` when
the body has a ``seed`` (else one drawn by the server's generator, ``--seed``), so a choice equals that seed run alone.
Token logprobs are the model's own (log_softmax of the raw logits, see
``rwkv7_core.sampling.TokenLogprobs``).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import numpy as np

from rwkv7_core.sampling import MAX_TOKENS_LIMIT, SEED_MAX, SamplingParams, TokenLogprobs
from scheduler import Request, RequestOutput
from scheduler.validation import prompt_tokens, sampling_params

from . import chat, structured, tool_calls
from .protocol import BAN, APIError, prompt_list
from .service import UNAVAILABLE, Service, ServiceClosed, Token
from .streaming import TextStream, sse

# SamplingParams field -> request body field, where they differ
BODY_NAMES = {"stop_tokens": "stop_token_ids", "banned_tokens": "banned_token_ids"}


@dataclass
class Limits:
    max_prompt_tokens: int
    max_waiting: int
    max_tokens_limit: int = MAX_TOKENS_LIMIT


@dataclass
class Context:
    """What handlers need besides the body."""
    service: Service
    model_name: str
    tokenizer: Any          # WorldTokenizer or None
    vocab_size: int
    defaults: dict          # sampling defaults (SamplingParams fields)
    limits: Limits
    seeds: np.random.Generator  # draws the seeds of requests that give none
    states: dict = field(default_factory=dict)  # named initial states: {name: rwkv7_apps.states.NamedState}
    replies: chat.ReplyTokens = field(default_factory=chat.ReplyTokens)  # generated ids of chat replies
    state_dtype: str = "float32"  # the engine's wkv state dtype (reported by /v1/models)


@dataclass
class Choice:
    index: int
    prompt_index: int
    request_id: str
    text: TextStream
    tokens: list[int] = field(default_factory=list)
    scores: list[TokenLogprobs] = field(default_factory=list)
    output: RequestOutput | None = None
    sent_role: bool = False
    content: str = ""          # the text sent so far
    logprobs_offset: int = 0   # text_offset of its next completion logprobs entry
    reader: tool_calls.CallReader | None = None  # a stream with tools: its text read as content or tool calls


@dataclass
class Job:
    """A validated request: its prompts (token ids), choices and rendering options."""
    kind: str                       # "completion" | "chat"
    body: Any
    prompts: list[list[int]]
    prompt_texts: list[str | None]
    choices: list[Choice]
    logprobs: int | None            # alternatives per token (None = no logprobs)
    echo: bool
    tools: tool_calls.ToolPlan | None = None  # a chat request's tools (answers read as tool calls)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


# ----------------------------------------------------------------------------- building
def build_job(ctx: Context, body, kind: str, chat_tokens: list[int] | None = None
              ) -> tuple[Job, list[list[Request]]]:
    """The job and, per prompt, its scheduler requests (one per choice); APIError(400/404/429).
    ``chat_tokens``: a chat's prompt, given (the Responses API's continuations) instead of
    rendered from ``body.messages``."""
    _check_model(ctx, body)
    _check_options(ctx, body)
    initial = initial_state(ctx, body.state)
    plan = structured.tool_plan(body) if kind == "chat" else None
    if kind == "chat":
        if ctx.tokenizer is None:
            raise APIError(400, f"chat needs the World vocabulary; this model has {ctx.vocab_size} tokens "
                                "(use /v1/completions with token-id prompts)", "messages")
        prompts, texts = _chat_prompt(ctx, body, plan, chat_tokens)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        stops = body.stop_list() + [chat.TURN_STOP]
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        echo = False
    else:
        prompts, texts = [], []
        batch = prompt_list(body.prompt)
        single = len(batch) == 1 and (isinstance(body.prompt, str) or isinstance(body.prompt[0], int))
        for i, p in enumerate(batch):
            prompts.append(_tokens(ctx, p, "prompt" if single else f"prompt[{i}]"))
            texts.append(p if isinstance(p, str) else None)
        logprobs, stops, max_tokens, echo = body.logprobs, body.stop_list(), body.max_tokens, body.echo
    where = "prompt" if kind == "completion" else "messages"
    for tokens in prompts:
        if not tokens:
            raise APIError(400, f"{where}: the prompt is empty", where)
        if len(tokens) > ctx.limits.max_prompt_tokens:
            raise APIError(400, f"{where}: {len(tokens)} prompt tokens, more than the server's "
                                f"--max-prompt-tokens {ctx.limits.max_prompt_tokens}", where)
    unsupported = ctx.service.scheduler.logprobs_unsupported
    if logprobs is not None and unsupported is not None:
        raise APIError(400, f"logprobs: {unsupported}", "logprobs")
    params = _params(ctx, body, stops, max_tokens, logprobs)
    constraint, plan = structured.request_constraint(ctx, body, plan)
    job = Job(kind, body, prompts, texts, [], logprobs, echo, plan)
    groups = []
    for p, tokens in enumerate(prompts):
        group = []
        for k in range(body.n):
            index = p * body.n + k
            seed = int(ctx.seeds.integers(2**32)) if body.seed is None else (body.seed + index) % (SEED_MAX + 1)
            rid = ctx.service.new_id(job.id)
            reader = plan.reader() if plan is not None and body.stream else None
            job.choices.append(Choice(index, p, rid, TextStream(stops), reader=reader))
            group.append(Request(rid, tokens, params.replace(seed=seed), initial_state=initial,
                                 constraint=constraint))
        groups.append(group)
    waiting = ctx.service.scheduler.queue_sizes()["waiting"]
    if waiting + len(job.choices) > ctx.limits.max_waiting:
        raise APIError(429, f"server busy: {waiting} requests waiting (--max-waiting {ctx.limits.max_waiting}); "
                            "retry later")
    return job, groups


def _chat_prompt(ctx: Context, body, plan, chat_tokens: list[int] | None) -> tuple[list, list]:
    """([prompt ids], [prompt text]) of a chat body: its messages (tool calls and results as
    history text, the tools' instructions first) through the chat template, or ``chat_tokens``
    as given (the Responses API's continuations; no text)."""
    if chat_tokens is not None:
        return [chat_tokens], [None]
    messages = [(m.role, structured.history_text(m)) for m in body.messages]
    messages = ([("system", plan.system_text())] if plan is not None else []) + messages
    return [chat.encode(ctx.tokenizer, messages, ctx.replies)], [chat.render(messages)]


def initial_state(ctx: Context, name: str | None):
    """The InitialState of the ``state`` field (None for None); APIError(400) naming an
    unknown one."""
    if name is None:
        return None
    if name not in ctx.states:
        known = ", ".join(sorted(ctx.states)) or "none; start the server with --state NAME=FILE"
        raise APIError(400, f"state: unknown state {name!r} (registered: {known})", "state")
    return ctx.states[name].initial


def tokenize(ctx: Context, body) -> list[int]:
    """The token ids of a ``/tokenize`` body's prompt or chat messages; APIError(400/404)."""
    _check_model(ctx, body)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of 'prompt' and 'messages'", "prompt")
    if body.messages is not None:
        if ctx.tokenizer is None:
            raise APIError(400, f"messages need the World vocabulary; this model has {ctx.vocab_size} tokens",
                           "messages")
        return _chat_prompt(ctx, body, None, None)[0][0]  # as chat completions render them
    return _tokens(ctx, body.prompt, "prompt")


def detokenize(ctx: Context, body) -> str:
    """The text of a ``/detokenize`` body's token ids; APIError(400/404)."""
    _check_model(ctx, body)
    if ctx.tokenizer is None:
        raise APIError(400, f"text needs the World vocabulary; this model has {ctx.vocab_size} tokens", "tokens")
    try:
        ids = prompt_tokens(body.tokens, ctx.vocab_size) if body.tokens else []
    except ValueError as e:
        raise APIError(400, f"tokens: {e}", "tokens") from None
    return ctx.tokenizer.decode_bytes(ids).decode("utf-8", errors="replace")


def _check_model(ctx: Context, body) -> None:
    if body.model is not None and body.model != ctx.model_name:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {ctx.model_name!r}", "model")


def _tokens(ctx: Context, prompt, param: str) -> list[int]:
    if isinstance(prompt, str):
        if ctx.tokenizer is None:
            raise APIError(400, f"{param}: a text prompt needs the World vocabulary; this model has {ctx.vocab_size} "
                                "tokens: send token ids instead", param)
        return ctx.tokenizer.encode(prompt)
    if not prompt:
        return []  # reported as an empty prompt
    try:
        return prompt_tokens(prompt, ctx.vocab_size)
    except ValueError as e:
        raise APIError(400, f"{param}: {e}", param) from None


def _check_options(ctx: Context, body) -> None:
    """400 for the option values this server cannot honour (protocol.py's field policy)."""
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options: only allowed with stream=true", "stream_options")
    for token, bias in (body.logit_bias or {}).items():
        if not token.isdigit() or int(token) >= ctx.vocab_size:
            raise APIError(400, f"logit_bias: key {token[:40]!r} is not a token id in [0, {ctx.vocab_size})",
                           "logit_bias")
        if bias != BAN:
            raise APIError(400, f"logit_bias: token {token} has bias {bias}; only {BAN:g} (a ban) is supported",
                           "logit_bias")


def _banned(body) -> list[int] | None:
    """``banned_token_ids`` plus the tokens ``logit_bias`` bans (None: neither given)."""
    if body.banned_token_ids is None and not body.logit_bias:
        return None
    return list(body.banned_token_ids or []) + [int(t) for t in body.logit_bias or {}]


def _params(ctx: Context, body, stops: list[str], max_tokens, logprobs) -> SamplingParams:
    fields = dict(ctx.defaults)
    stop_tokens = [] if body.ignore_eos and body.stop_token_ids is None else body.stop_token_ids
    given = {"max_tokens": max_tokens, "temperature": body.temperature, "top_p": body.top_p,
             "top_k": body.top_k, "presence_penalty": body.presence_penalty,
             "frequency_penalty": body.frequency_penalty, "penalty_decay": body.penalty_decay,
             "stop_tokens": stop_tokens, "banned_tokens": _banned(body)}
    fields.update({k: v for k, v in given.items() if v is not None})
    if stops:
        if ctx.tokenizer is None:
            raise APIError(400, f"stop: stop strings need the World vocabulary; this model has {ctx.vocab_size} "
                                "tokens: use stop_token_ids", "stop")
        fields["stop"] = list(fields.get("stop") or []) + stops
    fields["logprobs"] = logprobs
    try:
        return sampling_params(fields, ctx.vocab_size, ctx.tokenizer, max_tokens_limit=ctx.limits.max_tokens_limit)
    except (ValueError, TypeError) as e:
        message = str(e)
        name = message.split("=")[0].removeprefix("SamplingParams.") if message.startswith("SamplingParams.") else None
        name = BODY_NAMES.get(name, name)
        raise APIError(400, f"{name}: {message.split(': ', 1)[-1]}" if name else message, name) from None


# ----------------------------------------------------------------------------- running
async def submit(ctx: Context, job: Job,
                 groups: list[list[Request]]) -> tuple[asyncio.Queue, list[TokenLogprobs | None]]:
    """Queue the job's requests; score the prompts first when echo asks for logprobs."""
    scores = [None] * len(job.prompts)
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
                if job.kind == "chat":
                    _remember_reply(ctx, job, choice)
                batch.append((choice, delta, True, None))
        yield batch


def _remember_reply(ctx: Context, job: Job, choice: Choice) -> None:
    """Keep a finished chat reply's generated ids (``chat.ReplyTokens``), so the next turn
    that sends it back continues from exactly what the model saw."""
    if choice.output.finish_reason not in ("length", "stop"):
        return
    ids = chat.reply_ids(ctx.tokenizer, choice.tokens, choice.content, choice.text.stopped)
    if ids is not None:
        ctx.replies.remember(job.prompts[choice.prompt_index], choice.content, ids)


def token_bytes(ctx: Context, token: int) -> bytes:
    return ctx.tokenizer.decode_bytes([token]) if ctx.tokenizer is not None else b""


def token_string(ctx: Context, token: int) -> str:
    if ctx.tokenizer is None:
        return f"token_id:{token}"
    return ctx.tokenizer.decode_bytes([token]).decode("utf-8", errors="replace")


def failure(choice: Choice) -> APIError | None:
    """The error a finished choice stands for (an engine fault is a 500; one the service
    ended, on shutdown or failure, a 503), else None."""
    out = choice.output
    if out is None or out.finish_reason != "error":
        return None
    error = out.error or "request failed"
    status = 400 if error.startswith("invalid request") else 503 if error.startswith(UNAVAILABLE) else 500
    return APIError(status, error)


def finish_reason(choice: Choice) -> str:
    return "stop" if choice.text.stopped else choice.output.finish_reason


def chat_answer(job: Job, choice: Choice, text: str) -> tuple[dict, str]:
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


# ----------------------------------------------------------------------------- rendering
def completion_logprobs(ctx: Context, job: Job, choice: Choice, prompt_scores: TokenLogprobs | None,
                        with_prompt: bool, scores=None, tokens=None, with_stop: bool = True) -> dict:
    """OpenAI legacy logprobs: tokens, token_logprobs, top_logprobs, text_offset. A choice
    that ended on a stop token gets that token last (``with_stop``), as an empty string with
    its logprob: so echo + logprobs always scores every position after the prompt (the
    lm-evaluation-harness reads the last one as the generated token's)."""
    k = job.logprobs
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = choice.logprobs_offset  # where the choice's previous entries ended (a stream's chunks)

    def add(token: int, lp: TokenLogprobs | None, shown: str | None = None):
        nonlocal offset
        s = token_string(ctx, token)
        shown = s if shown is None else shown
        out["tokens"].append(shown)
        out["text_offset"].append(offset)
        offset += len(shown)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            return
        top = {token_string(ctx, int(t)): float(v) for t, v in zip(lp.top_ids[0][:k], lp.top_logprobs[0][:k])}
        top.setdefault(s, float(lp.chosen[0]))
        out["token_logprobs"].append(float(lp.chosen[0]))
        out["top_logprobs"].append(top)

    if with_prompt:
        prompt = job.prompts[choice.prompt_index]
        for pos, token in enumerate(prompt):
            add(token, None if pos == 0 or prompt_scores is None else prompt_scores.row(pos - 1))
    for token, lp in zip(choice.tokens if tokens is None else tokens,
                         choice.scores if scores is None else scores):
        add(token, lp)
    ended = choice.output
    if with_stop and ended is not None and ended.stop_logprobs is not None:
        add(ended.stop_token, ended.stop_logprobs, shown="")
    choice.logprobs_offset = offset
    return out


def chat_logprobs(ctx: Context, job: Job, tokens, scores) -> dict:
    k = job.logprobs

    def entry(token: int, value: float) -> dict:
        b = token_bytes(ctx, token)
        return {"token": token_string(ctx, token), "logprob": value, "bytes": list(b)}

    content = []
    for token, lp in zip(tokens, scores):
        item = entry(token, float(lp.chosen[0]))
        item["top_logprobs"] = [entry(int(t), float(v)) for t, v in zip(lp.top_ids[0][:k], lp.top_logprobs[0][:k])]
        content.append(item)
    return {"content": content}


def usage(job: Job) -> dict:
    """Token counts; ``prompt_tokens_details.cached_tokens``: prompt tokens the prefix cache
    served (each prompt counted once, however many choices share it)."""
    prompt = sum(len(p) for p in job.prompts)
    completion = sum(len(c.tokens) for c in job.choices)
    cached = {c.prompt_index: c.output.cached_tokens for c in job.choices if c.output is not None}
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(cached.values())}}


def response(ctx: Context, job: Job, texts: dict[int, str], prompt_scores: list) -> dict:
    """The whole (non-streamed) response body."""
    choices = []
    for c in job.choices:
        item: dict[str, Any] = {"index": c.index, "finish_reason": finish_reason(c)}
        if job.kind == "chat":
            message, item["finish_reason"] = chat_answer(job, c, texts[c.index])
            item["message"] = {"role": "assistant", **message}
            item["logprobs"] = chat_logprobs(ctx, job, c.tokens, c.scores) if job.logprobs is not None else None
        else:
            prefix = job.prompt_texts[c.prompt_index] if job.echo else ""
            if job.echo and prefix is None:
                prefix = ctx.tokenizer.decode(job.prompts[c.prompt_index]) if ctx.tokenizer else ""
            item["text"] = prefix + texts[c.index]
            item["logprobs"] = (completion_logprobs(ctx, job, c, prompt_scores[c.prompt_index], job.echo)
                                if job.logprobs is not None else None)
        if job.body.return_token_ids:
            item["token_ids"] = list(c.tokens)
        choices.append(item)
    return {"id": _prefixed(job), "object": "chat.completion" if job.kind == "chat" else "text_completion",
            "created": job.created, "model": ctx.model_name, "choices": choices, "usage": usage(job)}


def _prefixed(job: Job) -> str:
    return ("chatcmpl-" if job.kind == "chat" else "cmpl-") + job.id


def chunk(ctx: Context, job: Job, choices: list[dict], with_usage: bool = False) -> str:
    """One SSE chunk of a streamed response; with the usage so far when asked (the last chunk
    of ``include_usage``) or in every chunk (``continuous_usage_stats``)."""
    options = job.body.stream_options
    with_usage = with_usage or (options is not None and options.continuous_usage_stats)
    body = {"id": _prefixed(job), "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
            "created": job.created, "model": ctx.model_name, "choices": choices}
    if with_usage:
        body["usage"] = usage(job)
    return sse(body)


def stream_chunks(ctx: Context, job: Job, choice: Choice, delta: str, finished: bool,
                  prompt_scores: list, token: Token | None = None) -> list[str]:
    """SSE chunks for one event of a streamed response (``token``: the one this event drew)."""
    chunks, calls = [], []
    item: dict[str, Any] = {"index": choice.index}
    new_tokens = [token.id] if token is not None else []
    new_scores = [token.logprobs] if token is not None and job.logprobs is not None else []
    if job.kind == "chat":
        if not choice.sent_role:
            choice.sent_role = True
            chunks.append(chunk(ctx, job, [{"index": choice.index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]))
        if choice.reader is not None:  # text as it comes, tool calls once the marker is written
            delta, calls = choice.reader.feed(delta)
            if finished:
                delta += choice.reader.finish()
        item["delta"] = {"content": delta} if delta else {}
        if calls:
            item["delta"]["tool_calls"] = calls
        item["logprobs"] = chat_logprobs(ctx, job, new_tokens, new_scores) if new_scores else None
    else:
        if job.echo and not choice.sent_role:
            choice.sent_role = True
            prompt = job.prompt_texts[choice.prompt_index]
            if prompt is None:
                prompt = ctx.tokenizer.decode(job.prompts[choice.prompt_index]) if ctx.tokenizer else ""
            echo_item = {"index": choice.index, "text": prompt, "finish_reason": None,
                         "logprobs": (completion_logprobs(ctx, job, choice, prompt_scores[choice.prompt_index],
                                                          True, scores=[], tokens=[], with_stop=False)
                                      if job.logprobs is not None else None)}
            chunks.append(chunk(ctx, job, [echo_item]))
        item["text"] = delta
        stop_scored = finished and choice.output.stop_logprobs is not None
        item["logprobs"] = (completion_logprobs(ctx, job, choice, None, False, new_scores, new_tokens,
                                                with_stop=finished)
                            if new_scores or stop_scored else None)
    item["finish_reason"] = (chat_answer(job, choice, "")[1] if finished and job.kind == "chat"
                             else finish_reason(choice) if finished else None)
    if job.body.return_token_ids:
        item["token_ids"] = new_tokens
    if finished or delta or calls or new_scores or job.body.return_token_ids:
        chunks.append(chunk(ctx, job, [item]))
    return chunks


DISCONNECT_POLL_S = 0.25


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
