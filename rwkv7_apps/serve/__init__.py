"""``rwkv7-serve``: an OpenAI-compatible HTTP server on the scheduler.

app.py (routes, auth, limits, errors), protocol.py (request bodies). A completion or chat
takes three steps: build.py (the body becomes a job.py ``Job`` and its scheduler requests;
structured.py prepares its constraint and tool plan), running.py (the scheduler runs it,
through service.py: the scheduler thread and its bridge to asyncio), render.py with
render_completion.py / render_chat.py (the reply or the stream; logprobs.py). Also chat.py
(RWKV World chat format), streaming.py (UTF-8-safe text deltas, SSE), responses.py (the
Responses API), metrics.py (Prometheus), cli.py (the command).
"""
