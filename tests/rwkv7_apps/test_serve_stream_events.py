"""Streamed chunks when one wake-up of the event loop carries several tokens of one choice
(a slow client loop against fast decode steps): each chunk reports its own token id and
logprobs, in order, none repeated or lost."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np

from rwkv7_apps.serve import build, render, running
from rwkv7_apps.serve.job import Choice, Job
from rwkv7_apps.serve.protocol import CompletionRequest
from rwkv7_apps.serve.service import Token
from rwkv7_apps.serve.streaming import TextStream
from rwkv7_core.sampling import TokenLogprobs
from scheduler import RequestOutput


def _stream_all_queued_at_once(ids, logprobs):
    ctx = SimpleNamespace(tokenizer=None, model_name="m")
    choice = Choice(index=0, prompt_index=0, request_id="r0", text=TextStream())
    body = CompletionRequest(prompt=[1, 2], stream=True, return_token_ids=True)
    job = Job(build.COMPLETION, body, [[1, 2]], [None], [choice], logprobs=1 if logprobs else None, echo=False)
    queue: asyncio.Queue = asyncio.Queue()
    for i, t in enumerate(ids):  # everything is queued before the handler wakes up
        scores = TokenLogprobs(np.array([-0.1 * i], np.float32), np.array([[t]], np.int32),
                               np.array([[-0.1 * i]], np.float32)) if logprobs else None
        queue.put_nowait(("r0", Token(t, 0.0, scores)))
    queue.put_nowait(("r0", RequestOutput("r0", list(ids), "length", None, 2, len(ids), 0.0, None, 0.0)))

    async def run():
        chunks = []
        async for batch in running.events(ctx, job, queue):
            for choice, delta, finished, token in batch:
                chunks += render.stream_chunks(ctx, job, choice, delta, finished, [None], token)
        return chunks
    return [json.loads(c.removeprefix("data: ")) for c in asyncio.run(run())]


def test_each_chunk_carries_its_own_token_when_a_wake_up_has_several():
    rng = np.random.default_rng()
    ids = rng.integers(0, 500, int(rng.integers(3, 9))).tolist()
    for logprobs in (False, True):
        chunks = _stream_all_queued_at_once(ids, logprobs)
        choices = [c["choices"][0] for c in chunks]
        assert [t for ch in choices for t in ch["token_ids"]] == ids
        assert choices[-1]["finish_reason"] == "length" and choices[-1]["token_ids"] == []
        if logprobs:
            scored = [ch["logprobs"]["token_logprobs"][0] for ch in choices[:-1]]
            assert np.allclose(scored, [-0.1 * i for i in range(len(ids))])
