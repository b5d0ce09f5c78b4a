"""``rwkv7-serve``: an OpenAI-compatible HTTP server on the scheduler.

app.py (routes, auth, limits, errors), protocol.py (request bodies), generation.py (a body
as scheduler requests; responses and stream chunks), service.py (the scheduler thread and
its bridge to asyncio), chat.py (RWKV World chat format), streaming.py (UTF-8-safe text
deltas, SSE), metrics.py (Prometheus), cli.py (the command).
"""
