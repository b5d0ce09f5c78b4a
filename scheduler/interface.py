"""The scheduler interface the apps drive: one ``Scheduler`` or a set of replicas
(scheduler/replicas/replica_set.py) behind the same methods."""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from rwkv7_core.sampling import TokenLogprobs

from .config import SchedulerConfig
from .request import Request, RequestOutput
from .stats import Stats


class SchedulerFailed(RuntimeError):
    """``run`` cannot go on (a worker thread died, every replica was taken out). Requests
    not yet reported through ``on_finish`` stay unfinished: a later process redoes them."""


class SchedulerInterface(Protocol):
    """``config``: its SchedulerConfig (``max_batch``: every row it decodes at once);
    ``engine``: an engine of it, for model facts (``vocab_size``, ``capabilities``);
    ``tokenizer``: the tokenizer of its stop strings, or None; ``results``: {id: output} of
    runs given no ``on_finish``; ``logprobs_unsupported``: why token logprobs cannot be served
    (None: they can). Methods as ``scheduler.core.Scheduler`` documents them."""
    config: SchedulerConfig
    tokenizer: Any
    results: dict[str, RequestOutput]
    logprobs_unsupported: str | None

    @property
    def engine(self): ...

    @property
    def stats(self) -> Stats: ...

    def add(self, request: Request) -> None: ...

    def add_group(self, requests: Sequence[Request]) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    def score(self, tokens: Sequence[int]) -> TokenLogprobs: ...

    def queue_sizes(self) -> dict[str, int]: ...

    def decode_buckets(self) -> list[int]: ...

    def unstarted(self) -> list[str]: ...

    def precompile(self) -> None: ...

    def run(self, on_token: Callable[[str, int], None] | None = None,
            on_finish: Callable[[RequestOutput], None] | None = None,
            should_stop: Callable[[], bool] | None = None,
            on_logprobs: Callable[[str, TokenLogprobs], None] | None = None,
            serve_until: Callable[[], bool] | None = None) -> None: ...
