"""The ``/v1/completions`` reply: text (the prompt first with ``echo``) and legacy logprobs."""
from __future__ import annotations

from typing import Any

from rwkv7_core.sampling import TokenLogprobs

from .job import Choice, Context, Job
from .logprobs import completion_logprobs, drawn
from .render import finish_reason
from .service import Token


class CompletionRenderer:
    object = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def choice(self, ctx: Context, job: Job, choice: Choice, text: str, prompt_scores: TokenLogprobs | None
               ) -> dict[str, Any]:
        prefix = _prompt_text(ctx, job, choice) if job.echo else ""
        return {"finish_reason": finish_reason(choice), "text": prefix + text,
                "logprobs": (completion_logprobs(ctx, job, choice, prompt_scores, job.echo)
                             if job.logprobs is not None else None)}

    def stream_item(self, ctx: Context, job: Job, choice: Choice, delta: str, finished: bool,
                    prompt_scores: TokenLogprobs | None, token: Token | None) -> tuple[list[dict], dict[str, Any], bool]:
        first = []
        if job.echo and not choice.sent_role:  # the prompt goes first, once
            choice.sent_role = True
            first.append({"index": choice.index, "text": _prompt_text(ctx, job, choice), "finish_reason": None,
                          "logprobs": (completion_logprobs(ctx, job, choice, prompt_scores, True, scores=[],
                                                           tokens=[], with_stop=False)
                                       if job.logprobs is not None else None)})
        tokens, scores = drawn(job, token)
        stop_scored = finished and choice.output.stop_logprobs is not None
        logprobs = (completion_logprobs(ctx, job, choice, None, False, scores, tokens, with_stop=finished)
                    if scores or stop_scored else None)
        return first, {"text": delta, "logprobs": logprobs}, bool(delta or scores)

    def finish_reason(self, job: Job, choice: Choice, text: str) -> str:
        return finish_reason(choice)


def _prompt_text(ctx: Context, job: Job, choice: Choice) -> str:
    text = job.prompt_texts[choice.prompt_index]
    if text is None:
        text = ctx.tokenizer.decode(job.prompts[choice.prompt_index]) if ctx.tokenizer else ""
    return text
