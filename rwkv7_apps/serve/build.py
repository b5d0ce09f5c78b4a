"""The request body of a completion or chat becomes one ``Job`` and its scheduler requests:
one builder per endpoint family (``completion_job``, ``chat_job``), the checks and the
sampling parameters they share, and the tokenizer endpoints' bodies."""
from __future__ import annotations

from typing import Any, NamedTuple

from rwkv7_core.sampling import SCALAR_FIELDS, SEED_MAX, SamplingFieldError, SamplingParams
from scheduler import Request
from scheduler.constraint import Constraint
from scheduler.request import InitialState
from scheduler.validation import prompt_tokens, sampling_params

from . import chat, structured
from .cache_namespace import request_salt
from .job import Choice, Context, Job, Renderer
from .limits import reply_entries
from .protocol import BAN, APIError, prompt_list
from .render_chat import ChatRenderer
from .render_completion import CompletionRenderer
from .streaming import TextStream
from .tool_calls import ToolPlan

# SamplingParams field -> request body field, where they differ
BODY_NAMES = {"stop_tokens": "stop_token_ids", "banned_tokens": "banned_token_ids"}
CHAT, COMPLETION = ChatRenderer(), CompletionRenderer()


class Prompts(NamedTuple):
    """What an endpoint family reads from its body before the shared part of a job."""
    tokens: list[list[int]]
    texts: list[str | None]
    where: str              # the body field the prompts come from
    logprobs: int | None
    stops: list[str]
    max_tokens: Any
    echo: bool


def completion_job(ctx: Context, body) -> tuple[Job, list[list[Request]]]:
    """A ``/v1/completions`` body's job and, per prompt, its scheduler requests (one per
    choice); APIError(400/404/429)."""
    initial = _check_body(ctx, body)
    constraint, _ = structured.prepare(ctx, body, chat=False)
    tokens, texts = [], []
    batch = prompt_list(body.prompt)
    single = len(batch) == 1 and (isinstance(body.prompt, str) or isinstance(body.prompt[0], int))
    for i, p in enumerate(batch):
        tokens.append(_tokens(ctx, p, "prompt" if single else f"prompt[{i}]"))
        texts.append(p if isinstance(p, str) else None)
    prompts = Prompts(tokens, texts, "prompt", body.logprobs, body.stop_list(), body.max_tokens, body.echo)
    return _job(ctx, body, COMPLETION, prompts, initial, constraint, None)


def chat_job(ctx: Context, body, chat_tokens: list[int] | None = None) -> tuple[Job, list[list[Request]]]:
    """A chat body's job and requests, as ``completion_job``. ``chat_tokens``: its prompt,
    given (the Responses API's continuations) instead of rendered from ``body.messages``."""
    initial = _check_body(ctx, body)
    if ctx.tokenizer is None:
        raise APIError(400, f"chat needs the World vocabulary; this model has {ctx.vocab_size} tokens "
                            "(use /v1/completions with token-id prompts)", "messages")
    constraint, plan = structured.prepare(ctx, body, chat=True)
    tokens, texts = _chat_prompt(ctx, body, plan, chat_tokens)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    prompts = Prompts(tokens, texts, "messages", (body.top_logprobs or 0) if body.logprobs else None,
                      body.stop_list() + [chat.TURN_STOP], max_tokens, False)
    return _job(ctx, body, CHAT, prompts, initial, constraint, plan)


def _job(ctx: Context, body, renderer: Renderer, prompts: Prompts, initial: InitialState | None,
         constraint: Constraint | None, plan: ToolPlan | None) -> tuple[Job, list[list[Request]]]:
    """The part every endpoint shares: prompt limits, sampling parameters, one request per choice."""
    where = prompts.where
    for tokens in prompts.tokens:
        if not tokens:
            raise APIError(400, f"{where}: the prompt is empty", where)
        if len(tokens) > ctx.limits.max_prompt_tokens:
            raise APIError(400, f"{where}: {len(tokens)} prompt tokens, more than the server's "
                                f"--max-prompt-tokens {ctx.limits.max_prompt_tokens}", where)
    unsupported = ctx.service.scheduler.logprobs_unsupported
    if prompts.logprobs is not None and unsupported is not None:
        raise APIError(400, f"logprobs: {unsupported}", "logprobs")
    params = _params(ctx, body, prompts.stops, prompts.max_tokens, prompts.logprobs)
    entries = reply_entries([len(t) for t in prompts.tokens], body.n, prompts.echo, params.max_tokens, prompts.logprobs)
    if entries > ctx.limits.max_reply_entries:
        raise APIError(400, f"the reply could hold {entries} token entries (n x prompts x (echoed prompt + "
                            f"max_tokens) x (1 + logprobs)), more than the server's --max-reply-entries "
                            f"{ctx.limits.max_reply_entries}", "n" if body.n > 1 else "max_tokens")
    job = Job(renderer, body, prompts.tokens, prompts.texts, [], prompts.logprobs, prompts.echo, plan,
              keeps_replies=renderer is CHAT)
    groups, salt = [], request_salt(body)
    for p, tokens in enumerate(prompts.tokens):
        group = []
        for k in range(body.n):
            index = p * body.n + k
            seed = int(ctx.seeds.integers(2**32)) if body.seed is None else (body.seed + index) % (SEED_MAX + 1)
            rid = ctx.service.new_id(job.id)
            reader = plan.reader() if plan is not None and body.stream else None
            job.choices.append(Choice(index, p, rid, TextStream(prompts.stops), reader=reader))
            group.append(Request(rid, tokens, params.replace(seed=seed), initial_state=initial,
                                 constraint=constraint, cache_salt=salt))
        groups.append(group)
    waiting = ctx.service.scheduler.queue_sizes()["waiting"]
    if waiting + len(job.choices) > ctx.limits.max_waiting:
        raise APIError(429, f"server busy: {waiting} requests waiting (--max-waiting {ctx.limits.max_waiting}); "
                            "retry later")
    return job, groups


def _chat_prompt(ctx: Context, body, plan: ToolPlan | None, chat_tokens: list[int] | None) -> tuple[list, list]:
    """([prompt ids], [prompt text]) of a chat body: its messages (tool calls and results as
    history text, the tools' instructions first) through the chat template, or ``chat_tokens``
    as given (the Responses API's continuations; no text)."""
    if chat_tokens is not None:
        return [chat_tokens], [None]
    messages = [(m.role, structured.history_text(m)) for m in body.messages]
    messages = ([("system", plan.system_text())] if plan is not None else []) + messages
    return [chat.encode(ctx.tokenizer, messages, ctx.replies)], [chat.render(messages)]


def initial_state(ctx: Context, name: str | None) -> InitialState | None:
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


def _check_body(ctx: Context, body) -> InitialState | None:
    """The body's initial state; 404 for another model, 400 for the option values this server
    cannot honour (protocol.py's field policy) or an unknown named state."""
    _check_model(ctx, body)
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options: only allowed with stream=true", "stream_options")
    for token, bias in (body.logit_bias or {}).items():
        if not token.isdigit() or int(token) >= ctx.vocab_size:
            raise APIError(400, f"logit_bias: key {token[:40]!r} is not a token id in [0, {ctx.vocab_size})",
                           "logit_bias")
        if bias != BAN:
            raise APIError(400, f"logit_bias: token {token} has bias {bias}; only {BAN:g} (a ban) is supported",
                           "logit_bias")
    return initial_state(ctx, body.state)


def _banned(body) -> list[int] | None:
    """``banned_token_ids`` plus the tokens ``logit_bias`` bans (None: neither given)."""
    if body.banned_token_ids is None and not body.logit_bias:
        return None
    return list(body.banned_token_ids or []) + [int(t) for t in body.logit_bias or {}]


def _params(ctx: Context, body, stops: list[str], max_tokens, logprobs) -> SamplingParams:
    fields = dict(ctx.defaults)
    stop_tokens = [] if body.ignore_eos and body.stop_token_ids is None else body.stop_token_ids
    given = {**{f.name: getattr(body, f.name) for f in SCALAR_FIELDS},
             "max_tokens": max_tokens, "stop_tokens": stop_tokens, "banned_tokens": _banned(body)}
    fields.update({k: v for k, v in given.items() if v is not None})
    if stops:
        if ctx.tokenizer is None:
            raise APIError(400, f"stop: stop strings need the World vocabulary; this model has {ctx.vocab_size} "
                                "tokens: use stop_token_ids", "stop")
        fields["stop"] = list(fields.get("stop") or []) + stops
    fields["logprobs"] = logprobs
    try:
        return sampling_params(fields, ctx.vocab_size, ctx.tokenizer, max_tokens_limit=ctx.limits.max_tokens_limit)
    except SamplingFieldError as e:
        name = BODY_NAMES.get(e.field, e.field)
        raise APIError(400, f"{name}: {e.why}", name) from None
    except (ValueError, TypeError) as e:
        raise APIError(400, str(e)) from None
