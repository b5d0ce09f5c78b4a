"""``rwkv7-serve`` (also ``python -m rwkv7_apps.serve``): the OpenAI-compatible HTTP server.

Loads the model, starts uvicorn at once (``/health`` answers 503 until ready), then (with
``--precompile``) runs the scheduler's ``precompile`` (every bucket and the prefill shapes
of its policy), starts the scheduler thread and reports ready.
SIGTERM/SIGINT drain the server (``--shutdown-grace``, exit 0); a scheduler that fails ends
the process with exit status 1 (shutdown.py). ``RWKV7_REPLICA_FAULT`` (tests only, see
rwkv7_apps/engine_guard.py) injects a fault into the engine, as replica 0.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from rwkv7_core.tokenizer import tokenizer_for

from ..engines import load_engine, random_model_path
from ..options import add_engine_options, add_model_options, add_sampling_options, check_engine_args, \
    sampling_defaults, scheduler_config

EXIT_BAD_ARGS = 2


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
    h.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (413 beyond)")
    h.add_argument("--shutdown-grace", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, how long requests in flight may run on before they end with an error")
    h.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    add_engine_options(p)
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="seed of the generator that draws seeds for requests without one (default: random)")
    add_sampling_options(p, "the request body")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    check_engine_args(p, args)
    if args.model is not None and not (os.path.isfile(args.model) or os.path.isdir(args.model)):
        p.error(f"--model {args.model}: no such file or model directory")
    for flag in ("max_prompt_tokens", "max_waiting", "max_body_bytes"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if not args.shutdown_grace >= 0:
        p.error("--shutdown-grace must be >= 0")
    if not 0 <= args.port < 65536:
        p.error(f"--port {args.port}: not a port number")


def build_app(sched, model_name: str, defaults: dict, limits, ready, seed: int | None = None,
              api_key: str | None = None, max_body_bytes: int = 4 << 20):
    """The ASGI app and its (not yet started) Service for ``sched`` (a
    ``scheduler.interface.SchedulerInterface``); ``ready()`` gates /health and the generation
    routes."""
    import numpy as np

    from .app import create_app
    from .generation import Context
    from .metrics import ServerMetrics
    from .service import Service

    metrics = ServerMetrics(sched)
    service = Service(sched, observer=metrics)
    ctx = Context(service, model_name, sched.tokenizer, sched.engine.vocab_size, defaults, limits,
                  np.random.default_rng(seed))
    return create_app(ctx, metrics, ready, api_key=api_key, max_body_bytes=max_body_bytes), service


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from scheduler import Scheduler

    from ..engine_guard import EngineGuard, Fault
    from .generation import Limits
    from .shutdown import DrainingServer

    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    logging.basicConfig(level=args.log_level.upper(), format="rwkv7-serve: %(message)s")
    model_path = args.model or random_model_path(args.random_model)
    try:
        engine = load_engine(args.backend, model_path, args.dtype, args.kernels, quantization=args.quantization)
    except (OSError, ValueError) as e:
        parser.exit(EXIT_BAD_ARGS, f"rwkv7-serve: error: cannot load model {model_path}: {e}\n")
    try:
        fault = Fault.from_env()
    except ValueError as e:
        parser.exit(EXIT_BAD_ARGS, f"rwkv7-serve: error: {e}\n")
    if fault is not None:
        engine = EngineGuard(engine, fault.of_replica(0))
    tokenizer = tokenizer_for(engine.vocab_size, model_path)
    if tokenizer is not None:
        tokenizer.decode_bytes([0])  # builds the lazy id -> bytes table before threads share it
    try:
        sched = Scheduler(engine, scheduler_config(args), tokenizer=tokenizer)
    except ValueError as e:
        parser.exit(EXIT_BAD_ARGS, f"rwkv7-serve: error: {e}\n")
    name = args.served_model_name or (os.path.splitext(os.path.basename(os.path.normpath(args.model)))[0] if args.model
                                      else f"random-{args.random_model}")
    ready = threading.Event()
    limits = Limits(args.max_prompt_tokens, args.max_waiting, args.max_tokens_limit)
    app, service = build_app(sched, name, sampling_defaults(args), limits, ready.is_set, seed=args.seed,
                             api_key=args.api_key, max_body_bytes=args.max_body_bytes)

    def warm_up() -> None:
        try:
            if sched.config.precompile:
                sched.precompile()
        except Exception as e:  # cannot serve: the server stops (exit status 1)
            service.fail(f"compiling failed: {type(e).__name__}: {e}")
            return
        service.start()
        ready.set()
        logging.getLogger("rwkv7_serve").warning("ready: http://%s:%d/v1 (model %s)", args.host, args.port, name)

    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5), service, args.shutdown_grace)
    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    try:
        server.run()
    finally:
        service.stop()
    return 1 if server.failed else 0


if __name__ == "__main__":
    sys.exit(main())
