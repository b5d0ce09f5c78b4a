"""Token logprobs as the OpenAI endpoints write them: the legacy completion form (tokens,
token_logprobs, top_logprobs, text_offset) and the chat form (content entries with bytes).
They are the model's own (log_softmax of the raw logits, ``rwkv7_core.sampling.TokenLogprobs``:
``chosen`` [1], ``top_ids`` / ``top_logprobs`` [1, K])."""
from __future__ import annotations

from typing import Any

from rwkv7_core.sampling import TokenLogprobs

from .job import Choice, Context, Job
from .service import Token


def token_bytes(ctx: Context, token: int) -> bytes:
    return ctx.tokenizer.decode_bytes([token]) if ctx.tokenizer is not None else b""


def token_string(ctx: Context, token: int) -> str:
    if ctx.tokenizer is None:
        return f"token_id:{token}"
    return ctx.tokenizer.decode_bytes([token]).decode("utf-8", errors="replace")


def drawn(job: Job, token: Token | None) -> tuple[list[int], list[TokenLogprobs]]:
    """The token one stream event drew, and its logprobs when the job asks for them."""
    if token is None:
        return [], []
    return [token.id], ([token.logprobs] if job.logprobs is not None else [])


def completion_logprobs(ctx: Context, job: Job, choice: Choice, prompt_scores: TokenLogprobs | None,
                        with_prompt: bool, scores=None, tokens=None, with_stop: bool = True) -> dict:
    """OpenAI legacy logprobs: tokens, token_logprobs, top_logprobs, text_offset. A choice
    that ended on a stop token gets that token last (``with_stop``), as an empty string with
    its logprob: so echo + logprobs always scores every position after the prompt (the
    lm-evaluation-harness reads the last one as the generated token's)."""
    k = job.logprobs
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
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
