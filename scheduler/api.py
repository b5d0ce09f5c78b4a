"""Offline API: complete a list of requests, results in input order."""
from __future__ import annotations

from typing import Callable, Sequence

from rwkv7_core.engine import Engine

from .config import SchedulerConfig
from .core import Scheduler
from .request import Request, RequestOutput


def generate(engine: Engine, requests: Sequence[Request], config: SchedulerConfig | None = None,
             tokenizer=None, on_token: Callable[[str, int], None] | None = None) -> list[RequestOutput]:
    """Run ``requests`` to completion on ``engine``; one RequestOutput per request, in input
    order (invalid requests come back with finish_reason "error"). ``on_token(id, token)``
    streams tokens as they are drawn."""
    scheduler = Scheduler(engine, config, tokenizer)
    for request in requests:
        scheduler.add(request)
    scheduler.run(on_token=on_token)
    return [scheduler.results.pop(r.id) for r in requests]
