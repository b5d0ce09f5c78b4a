"""How rwkv7-serve stops: a drain on SIGTERM / SIGINT, or at once when the service failed.

Drain: the service closes (new generation requests and ``/health`` answer 503), requests in
flight run on for up to ``grace`` seconds, then the rest are aborted (a stream gets an error
event and ``data: [DONE]``, any other request a JSON 503) and uvicorn stops; a second signal
ends the grace period at once. The process then exits 0.
Failure (``Service.outage`` "failed": the scheduler died, or compiling failed): the service
has aborted its requests already; one line on stderr and uvicorn stops (exit status 1).
"""
from __future__ import annotations

import logging
import threading
import time

import uvicorn

from .service import Service

log = logging.getLogger("rwkv7_serve")
POLL_S = 0.05


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains ``service`` on a signal and stops when it fails."""

    def __init__(self, config: uvicorn.Config, service: Service, grace: float):
        super().__init__(config)
        self.service, self.grace = service, grace
        self.failed = False
        self._grace_over = threading.Event()
        self._drain: threading.Thread | None = None

    def handle_exit(self, sig, frame) -> None:
        """The first signal starts the drain, a second ends its grace period (no re-raise of
        the signal after serving: a clean drain exits 0)."""
        if self._drain is not None:
            self._grace_over.set()
            return
        self._drain = threading.Thread(target=self._drain_then_stop, name="drain", daemon=True)
        self._drain.start()

    async def on_tick(self, counter: int) -> bool:
        outage = self.service.outage
        if outage is not None and outage.status == "failed" and not self.failed:
            self.failed = self.should_exit = True
            log.error("fatal: %s; exiting", outage.reason)
        return await super().on_tick(counter)

    def _drain_then_stop(self) -> None:
        self.service.close("the server is shutting down")
        deadline = time.monotonic() + self.grace
        while self.service.in_flight() and time.monotonic() < deadline and not self._grace_over.wait(POLL_S):
            pass
        left = self.service.in_flight()
        if left:
            log.warning("shutdown: ending %d requests unfinished after the grace period", left)
            self.service.abort(f"the server shut down before this request finished (--shutdown-grace {self.grace:g} s)")
        self.should_exit = True
