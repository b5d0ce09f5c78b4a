"""Request ids: every HTTP reply carries ``x-request-id`` (the client's own when it sent a
usable one: 1 to ``MAX_CHARS`` printable ASCII characters; else ``req_`` + 24 hex digits), and
the server's log lines written while that request is handled carry it too (``LogFilter``
prefixes them ``[id]``; ``RequestIds`` writes one ``info`` line per request with its method,
path, status and seconds), so a client's logs and the server's can be joined.
"""
from __future__ import annotations

import contextvars
import logging
import time
import uuid

HEADER = b"x-request-id"
MAX_CHARS = 128
current: contextvars.ContextVar[str | None] = contextvars.ContextVar("rwkv7_request_id", default=None)
log = logging.getLogger("rwkv7_serve")


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The id of a request: its own ``x-request-id`` when usable, else a fresh one."""
    given = dict(headers).get(HEADER, b"")
    if 0 < len(given) <= MAX_CHARS and all(0x21 <= b <= 0x7E for b in given):
        return given.decode()
    return "req_" + uuid.uuid4().hex[:24]


class RequestIds:
    """ASGI middleware: sets ``current`` for the request, adds ``x-request-id`` to its reply
    (replacing any the app set) and logs the request's line when the reply starts."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = request_id(scope.get("headers") or [])
        token = current.set(rid)
        started = time.monotonic()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": headers + [(HEADER, rid.encode())]}
                log.info("%s %s -> %d (%.3f s to the reply's start)", scope.get("method"), scope.get("path"),
                         message["status"], time.monotonic() - started)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current.reset(token)


class LogFilter(logging.Filter):
    """Prefixes a log record's message with ``[request id]`` when it is written while a
    request is handled (install it on the handlers of the server's log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = current.get()
        if rid is not None and not getattr(record, "request_id", None):
            record.request_id = rid
            record.msg = f"[{rid}] {record.msg}"
        return True
