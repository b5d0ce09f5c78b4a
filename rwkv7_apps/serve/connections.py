"""Connections the server keeps open, bounded (idle sockets, slowloris, the descriptor limit).

uvicorn closes a keep-alive connection ``timeout_keep_alive`` seconds after a response, but a
connection that never completes a request's headers (opened and left idle, or sending a header
byte now and then) is kept for ever, and every such socket holds a file descriptor: enough of
them and ``accept`` fails for everyone, ``/health`` included. ``guarded_protocol`` is uvicorn's
h11 protocol with two bounds:

- header timeout: a connection with no request in progress (none yet, or its last response
  sent) is closed once it has been so for ``header_timeout`` seconds, whatever it trickles;
- connection cap: at most ``max_connections`` are open; a new one beyond closes the connection
  idle the longest (so a probe still gets in), or itself when every one has a request running.

``default_max_connections`` keeps the cap below the process's descriptor limit.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import time
from typing import NamedTuple

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("rwkv7_serve")
DESCRIPTORS_RESERVED = 128  # model files, logs, compile caches, the listening socket ...
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0


class ConnectionLimits(NamedTuple):
    max_connections: int
    header_timeout: float


def default_max_connections() -> int:
    """The soft descriptor limit less ``DESCRIPTORS_RESERVED`` (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft if soft != resource.RLIM_INFINITY else 65536) - DESCRIPTORS_RESERVED)


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connections")
    group.add_argument("--max-connections", type=int, default=None, metavar="N",
                       help="most open connections (default: the descriptor limit less "
                            f"{DESCRIPTORS_RESERVED}); beyond, the longest idle one is closed")
    group.add_argument("--header-timeout", type=float, default=DEFAULT_HEADER_TIMEOUT, metavar="SECONDS",
                       help="close a connection that has no request in progress for this long (default "
                            f"{DEFAULT_HEADER_TIMEOUT:g}): idle and slowly-sent-header sockets")
    group.add_argument("--keep-alive-timeout", type=float, default=DEFAULT_KEEP_ALIVE_TIMEOUT, metavar="SECONDS",
                       help=f"close a keep-alive connection this long after its last response (default "
                            f"{DEFAULT_KEEP_ALIVE_TIMEOUT:g})")


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The limits of parsed options (ValueError naming a bad one)."""
    cap = args.max_connections if args.max_connections is not None else default_max_connections()
    if cap < 1:
        raise ValueError(f"--max-connections {cap}: must be >= 1")
    for flag, value in (("--header-timeout", args.header_timeout), ("--keep-alive-timeout", args.keep_alive_timeout)):
        if not value > 0:
            raise ValueError(f"{flag} {value}: must be > 0")
    return ConnectionLimits(cap, args.header_timeout)


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol class (``uvicorn.Config(http=...)``) under ``limits``."""

    class GuardedH11(H11Protocol):
        idle_since = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            others = [c for c in self.connections if c is not self]
            super().connection_made(transport)
            self.idle_since = time.monotonic()
            self.loop.call_later(limits.header_timeout, self.check_idle)
            if len(others) >= limits.max_connections:
                idle = [c for c in others if isinstance(c, GuardedH11) and c.is_idle()]
                victim = min(idle, key=lambda c: c.idle_since) if idle else self
                log.warning("connection cap %d reached: closing %s", limits.max_connections,
                            "the longest idle connection" if victim is not self else "a new connection")
                victim.transport.close()

        def is_idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.idle_since = time.monotonic()
            if not self.transport.is_closing():
                self.loop.call_later(limits.header_timeout, self.check_idle)

        def check_idle(self) -> None:
            """Close the connection when it has had no request in progress for header_timeout."""
            if self.transport.is_closing() or not self.is_idle():
                return
            left = self.idle_since + limits.header_timeout - time.monotonic()
            if left > 0:
                self.loop.call_later(left, self.check_idle)
            else:
                self.transport.close()

    return GuardedH11
