"""``rwkv7-serve`` (also ``python -m rwkv7_apps.serve``): the OpenAI-compatible HTTP server.

Loads the model, starts uvicorn at once (``/health`` answers 503 until ready), then (unless
``--no-precompile``) runs the scheduler's ``precompile`` (every executable a request can
reach: the buckets and resizes, the policy's prefill shapes, the logprob paths; a persistent
compilation cache makes the next start fast), logs how long it took, starts the scheduler
thread and reports ready: no request then waits on a compile (``/metrics`` counts every
compile, ``rwkv7_compiles_total``).
SIGTERM/SIGINT drain the server (``--shutdown-grace``, exit 0); a scheduler that fails ends
the process with exit status 1 (shutdown.py). ``--data-parallel N`` / ``--ray`` serve on a
replica set (rwkv7_apps/scheduler_setup.py); ``--state NAME=FILE`` registers named initial
states. ``RWKV7_REPLICA_FAULT`` (tests only, see scheduler/replicas/engine_guard.py) injects a fault
into the engine of its replica.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import urllib.request

import numpy as np
import uvicorn

from scheduler.replicas.replica_set import ReplicaSet

from ..engines import random_model_path
from ..options import (
    add_engine_options,
    add_model_options,
    add_replica_options,
    add_sampling_options,
    check_engine_args,
    sampling_defaults,
)
from ..scheduler_setup import build_scheduler
from ..states import register_states, state_option
from . import structured
from .app import create_app
from .connections import add_connection_options, connection_limits, guarded_protocol
from .job import Context, Limits
from .limits import DEFAULT_MAX_REPLY_ENTRIES
from .metrics import ServerMetrics
from .replica_metrics import ReplicaCollector
from .request_ids import LogFilter
from .response_store import DEFAULT_MAX_COUNT, DEFAULT_MAX_MB, ResponseStore
from .service import Service, ServiceClosed
from .shutdown import DrainingServer

OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}
"""rwkv7-serve's sampling defaults where a request omits the fields: OpenAI's (vLLM's too,
without a model generation config); the batch command keeps greedy decoding."""
EXIT_BAD_ARGS = 2
SERVER_PREFIX_CACHE_MB = 1024.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rwkv7-serve", description="Serve an RWKV-7 model over an "
                                "OpenAI-compatible HTTP API (completions, chat, streaming, logprobs).")
    add_model_options(p)
    h = p.add_argument_group("server")
    h.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    h.add_argument("--port", type=int, default=8000)
    h.add_argument("--api-key", default=os.environ.get("RWKV7_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default $RWKV7_API_KEY; none = open)")
    h.add_argument("--served-model-name", default=None, help="model id in responses and /v1/models "
                   "(default: the checkpoint's file stem or the random model's name)")
    h.add_argument("--max-prompt-tokens", type=int, default=8192, help="longest prompt accepted (400 beyond)")
    h.add_argument("--max-waiting", type=int, default=1024,
                   help="most requests queued before prefill; more are refused with 429")
    h.add_argument("--max-reply-entries", type=int, default=DEFAULT_MAX_REPLY_ENTRIES, metavar="N",
                   help="largest reply a request may ask for, in token entries: n x prompts x (echoed prompt + "
                        f"max_tokens) x (1 + logprobs) (default {DEFAULT_MAX_REPLY_ENTRIES}; 400 beyond)")
    h.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (413 beyond)")
    h.add_argument("--shutdown-grace", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, how long requests in flight may run on before they end with an error")
    h.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    h.add_argument("--response-store-count", type=int, default=DEFAULT_MAX_COUNT, metavar="N",
                   help=f"most stored responses of the Responses API, oldest evicted (default {DEFAULT_MAX_COUNT})")
    h.add_argument("--response-store-mb", type=float, default=DEFAULT_MAX_MB, metavar="MB",
                   help=f"most megabytes of stored responses (tokens + JSON), oldest evicted (default {DEFAULT_MAX_MB:g})")
    h.add_argument("--state", action="append", type=state_option, default=None, metavar="NAME=FILE",
                   help="register an initial state (state file or tuned-state .pth/.safetensors); a request "
                        "with \"state\": \"NAME\" starts from it (repeatable)")
    h.add_argument("--metrics-open", action="store_true",
                   help="serve /metrics without the --api-key (its prefix-cache counters tell one client "
                        "about another's prompts: docs/server.md)")
    add_replica_options(h, "1", "a conversation's turns preferring the replica of its previous turn")
    add_connection_options(p)
    add_engine_options(p)
    # a server holds conversations: compile before ready, and keep finished turns' states (a
    # chat's next turn prefills only its new message) unless told otherwise
    p.set_defaults(precompile=True, prefix_cache_mb=SERVER_PREFIX_CACHE_MB)
    p.add_argument("--no-precompile", dest="precompile", action="store_false",
                   help="report ready before compiling anything (quick development starts; the first "
                        "requests of each new shape then wait for its compile)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="seed of the generator that draws seeds for requests without one (default: random)")
    add_sampling_options(p, "the request body", OPENAI_DEFAULTS)
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_engine_args(p, args)
    if args.model is not None and not (os.path.isfile(args.model) or os.path.isdir(args.model)):
        p.error(f"--model {args.model}: no such file or model directory")
    for flag in ("max_prompt_tokens", "max_waiting", "max_body_bytes", "response_store_count", "max_reply_entries"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if not args.response_store_mb > 0:
        p.error("--response-store-mb must be > 0")
    for _, path in args.state or []:
        if not os.path.isfile(path):
            p.error(f"--state {path}: no such file")
    if args.ray and args.state:
        p.error("--state does not work with --ray yet")
    if not args.shutdown_grace >= 0:
        p.error("--shutdown-grace must be >= 0")
    if not 0 <= args.port < 65536:
        p.error(f"--port {args.port}: not a port number")
    try:
        connection_limits(args)
    except ValueError as e:
        p.error(str(e))


def build_app(sched, model_name: str, defaults: dict, limits, ready, seed: int | None = None,
              api_key: str | None = None, max_body_bytes: int = 4 << 20, states: dict | None = None,
              responses=None, metrics_open: bool = False, state_dtype: str = "float32"):
    """The ASGI app and its (not yet started) Service for ``sched`` (a
    ``scheduler.interface.SchedulerInterface``); ``ready()`` gates /health and the generation
    routes; ``states``: the named initial states ({name: NamedState}); ``responses``: the
    Responses API's ResponseStore (None: default bounds); ``metrics_open``: /metrics without the key;
    ``state_dtype``: the engine's wkv state dtype (reported by /v1/models)."""
    metrics = ServerMetrics(sched)
    if isinstance(sched, ReplicaSet):
        metrics.registry.register(ReplicaCollector(sched))
    service = Service(sched, observer=metrics)
    ctx = Context(service, model_name, sched.tokenizer, sched.engine.vocab_size, defaults, limits,
                  np.random.default_rng(seed), dict(states or {}), state_dtype=state_dtype)
    return create_app(ctx, metrics, ready, api_key=api_key, max_body_bytes=max_body_bytes,
                      responses=responses, metrics_open=metrics_open), service


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    logging.basicConfig(level=args.log_level.upper(), format="rwkv7-serve: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(LogFilter())  # a request's log lines carry its x-request-id
    model_path = args.model or random_model_path(args.random_model)
    sched = build_scheduler(parser, args, model_path)
    if isinstance(sched, ReplicaSet):
        sched.notify = logging.getLogger("rwkv7_serve").warning
    if sched.tokenizer is not None:
        sched.tokenizer.decode_bytes([0])  # builds the lazy id -> bytes table before threads share it
    try:
        states = register_states(args.state or [], sched.engine.config, args.state_dtype) if args.state else {}
    except ValueError as e:  # an unreadable state file, or one of another model shape
        parser.exit(EXIT_BAD_ARGS, f"rwkv7-serve: error: {e}\n")
    name = args.served_model_name or (os.path.splitext(os.path.basename(os.path.normpath(args.model)))[0] if args.model
                                      else f"random-{args.random_model}")
    ready = threading.Event()
    limits = Limits(args.max_prompt_tokens, args.max_waiting, args.max_tokens_limit, args.max_reply_entries)
    app, service = build_app(sched, name, sampling_defaults(args), limits, ready.is_set, seed=args.seed,
                             api_key=args.api_key, max_body_bytes=args.max_body_bytes, states=states,
                             responses=ResponseStore(args.response_store_count, int(args.response_store_mb * 2**20)),
                             metrics_open=args.metrics_open, state_dtype=args.state_dtype)

    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5, timeout_keep_alive=args.keep_alive_timeout,
                                           http=guarded_protocol(connection_limits(args))),
                            service, args.shutdown_grace)
    threading.Thread(target=_warm_up, args=(sched, service, server, ready, args, name), name="warm-up",
                     daemon=True).start()
    try:
        server.run()
    finally:
        service.stop()
    return 1 if server.failed else 0



def _warm_up(sched, service, server, ready: threading.Event, args: argparse.Namespace, name: str) -> None:
    """The warm-up thread: precompile (unless --no-precompile), start the service, rehearse,
    then set ``ready``; a failed compile fails the service (the server exits with status 1)."""
    log = logging.getLogger("rwkv7_serve")
    try:
        structured.warm_up(sched.tokenizer, sched.engine.vocab_size, sched.engine)
        if sched.config.precompile:
            start = time.perf_counter()
            sched.precompile()
            log.warning("precompiled in %.1f s (%d executables; --no-precompile skips this)",
                        time.perf_counter() - start, sum(n for n, _ in sched.stats.compiles_by_kind().values()))
    except Exception as e:  # cannot serve: the server stops (exit status 1)
        service.fail(f"compiling failed: {type(e).__name__}: {e}")
        return
    service.start()
    if sched.config.precompile:
        try:
            _rehearse(service, server, args)
        except ServiceClosed:  # draining or failed meanwhile: never ready
            return
    ready.set()
    log.warning("ready: http://%s:%d/v1 (model %s)", args.host, args.port, name)


def _rehearse(service, server, args: argparse.Namespace) -> None:
    """One request through the scheduler and one over HTTP (/v1/models) before ready, so
    their first-call set-up (~10-100 ms on CPU) is not a client's first TTFT."""
    service.rehearse([1, 2, 3])
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    request = urllib.request.Request(f"http://{host}:{args.port}/v1/models",
                                     headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except OSError as e:  # only a rehearsal: serving goes on without it
        logging.getLogger("rwkv7_serve").debug("HTTP warm-up request failed: %s", e)


if __name__ == "__main__":
    sys.exit(main())
