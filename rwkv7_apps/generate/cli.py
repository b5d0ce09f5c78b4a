"""``rwkv7-generate`` (also ``python -m scheduler``): batch generation, JSONL in, JSONL out.

Resumable: ids already in the output file are skipped and a torn last line is cut off.
SIGINT/SIGTERM stop admissions, let in-flight requests finish, flush and exit (130/143);
a second signal stops at once (in-flight requests are then redone by the next run).
The model backends (jax, torch) are imported only inside ``main``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from rwkv7_core.tokenizer import WORLD_VOCAB_SIZE
from scheduler import Request, SchedulerFailed
from scheduler.constraint import Constraint
from scheduler.grammar import current_limits
from scheduler.grammar_limits import check as check_grammar
from scheduler.interface import SchedulerInterface
from scheduler.prefix_disk import DiskPrefixStore
from scheduler.replicas.build import replica_reports
from scheduler.validation import sampling_params

from ..engines import cache_dir, random_model_path
from ..options import (
    add_engine_options,
    add_model_options,
    add_replica_options,
    add_sampling_options,
    check_engine_args,
    sampling_defaults,
)
from ..scheduler_setup import build_scheduler
from ..states import RunStates, model_fingerprint, register_states, state_option
from .jsonl_io import MAX_LINE_BYTES, InputError, InputRequest, ResultWriter
from .metrics import build_metrics, plot_run, summary_table
from .run import BatchRun

EXIT_BAD_ARGS = 2
MAX_PROMPT_TOKENS = 1 << 20
"""Default --max-prompt-tokens: an RWKV state does not grow with the prompt, so the limit bounds
the prefill time and the host memory of one line's tokens (about 40 MB at 2**20), generous
for long documents while refusing a runaway line (a 50 MB prompt is some 10M tokens)."""


# ----------------------------------------------------------------------------- options
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rwkv7-generate", description="Generate completions for every prompt of a JSONL file "
        "with an RWKV-7 model; rerun the same command to resume an interrupted run.")
    add_model_options(p)
    p.add_argument("--input", required=True, metavar="IN.jsonl", help="one request per line")
    p.add_argument("--output", required=True, metavar="OUT.jsonl", help="results, appended; resumed if present")
    add_engine_options(p)
    p.add_argument("--prefix-cache-dir", metavar="DIR",
                   help="persistent prefix cache: entries also go to DIR and survive restarts")
    p.add_argument("--prefix-cache-disk-mb", type=float, default=1024.0, metavar="N",
                   help="most megabytes of entry files in --prefix-cache-dir (default 1024)")
    p.add_argument("--state", action="append", type=state_option, default=None, metavar="NAME=FILE",
                   help="register an initial state (state file or tuned-state .pth/.safetensors); a "
                        "request with \"state\": \"NAME\" starts from it (repeatable)")
    p.add_argument("--save-states", metavar="DIR",
                   help="write each successful request's final state as DIR/<id>.safetensors")
    add_replica_options(p, "auto", "requests routed to the least loaded")
    p.add_argument("--metrics", metavar="METRICS.json", help="write run metrics as JSON")
    p.add_argument("--plot", metavar="RUN.png", help="write a PNG of batch size, bucket and tok/s over time")
    p.add_argument("--max-prompt-tokens", type=int, default=MAX_PROMPT_TOKENS, metavar="N",
                   help=f"longest prompt a line may have (default {MAX_PROMPT_TOKENS}); a longer one gets an "
                        "error record")
    p.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES, metavar="N",
                   help=f"longest input line read, in bytes (default {MAX_LINE_BYTES}); a longer one is never held "
                        "or tokenized and gets an error record")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="run seed: a request without its own 'seed' gets one derived from S and its id")
    add_sampling_options(p, "the input")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fail at once (exit 2, clear message) on unusable paths or option values."""
    check_engine_args(p, args)
    if args.model is not None and not os.path.isdir(args.model):  # a directory: a Hugging Face model
        _check_readable(p, args.model, "--model")
    _check_readable(p, args.input, "--input")
    if os.path.realpath(args.input) == os.path.realpath(args.output):
        p.error("--input and --output are the same file")
    _check_writable(p, args.output, "--output")
    for flag, path in (("--metrics", args.metrics), ("--plot", args.plot)):
        if path is not None:
            _check_writable(p, path, flag)
    for _, path in args.state or []:
        _check_readable(p, path, "--state")
    for flag, path in (("--save-states", args.save_states), ("--prefix-cache-dir", args.prefix_cache_dir)):
        if path is not None:
            _check_directory(p, path, flag)
    if args.max_prompt_tokens < 1:
        p.error(f"--max-prompt-tokens {args.max_prompt_tokens}: must be >= 1")
    if args.max_line_bytes < 1:
        p.error(f"--max-line-bytes {args.max_line_bytes}: must be >= 1")
    if args.prefix_cache_disk_mb <= 0:
        p.error(f"--prefix-cache-disk-mb {args.prefix_cache_disk_mb:g}: must be > 0")
    if args.ray and (args.state or args.save_states or args.prefix_cache_dir):
        p.error("--state, --save-states and --prefix-cache-dir do not work with --ray yet")


def _check_readable(p: argparse.ArgumentParser, path: str, flag: str) -> None:
    if not os.path.exists(path):
        p.error(f"{flag} {path}: no such file")
    if not os.path.isfile(path):
        p.error(f"{flag} {path}: not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        p.error(f"{flag} {path}: cannot read it ({e.strerror})")


def _check_writable(p: argparse.ArgumentParser, path: str, flag: str) -> None:
    if os.path.exists(path):
        if not os.path.isfile(path):
            p.error(f"{flag} {path}: exists and is not a regular file")
        if not os.access(path, os.W_OK):
            p.error(f"{flag} {path}: not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        p.error(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        p.error(f"{flag} {path}: directory {parent} is not writable")


def _check_directory(p: argparse.ArgumentParser, path: str, flag: str) -> None:
    """A writable directory, created if missing."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        p.error(f"{flag} {path}: cannot create the directory ({e.strerror})")
    if not os.access(path, os.W_OK | os.X_OK):
        p.error(f"{flag} {path}: directory is not writable")


# ----------------------------------------------------------------------------- requests
def request_seed(run_seed: int, request_id: Any) -> int:
    """A stable per-request seed, so reruns and resumes draw the same tokens."""
    return zlib.crc32(json.dumps([run_seed, request_id]).encode()) & 0xFFFFFFFF


def make_request(item: InputRequest, defaults: dict[str, Any], args, vocab_size: int, tokenizer,
                 states: RunStates | None = None):
    """An InputRequest -> scheduler Request (internal id = its line number), or an InputError."""
    def fail(why: str) -> InputError:
        return InputError(item.line, item.id, f"line {item.line}: {why}")

    if "logprobs" in item.overrides:
        return fail("unknown sampling field 'logprobs' (token logprobs are served by rwkv7-serve)")
    fields = {**defaults, **item.overrides}
    try:  # checked against the grammar limits here, compiled by the scheduler: a bad one is this line's error
        constraint = Constraint.from_response_format(fields.pop("response_format", {"type": "text"}))
        if constraint is not None:
            check_grammar(constraint, current_limits())
    except ValueError as e:
        return fail(f"response_format: {e}")
    if fields.get("seed") is None:
        fields["seed"] = request_seed(args.seed, item.id)
    if tokenizer is None and fields.get("stop"):
        return fail(f"'stop' strings need the World tokenizer (vocabulary {WORLD_VOCAB_SIZE}), but this "
                    f"model's vocabulary has {vocab_size} tokens: use 'stop_tokens' instead")
    try:
        params = sampling_params(fields, vocab_size, tokenizer, max_tokens_limit=args.max_tokens_limit)
    except (ValueError, TypeError) as e:
        return fail(f"bad sampling field: {e}")
    if tokenizer is None and item.prompt is not None:
        return fail(f"text 'prompt' needs the World tokenizer (vocabulary {WORLD_VOCAB_SIZE}), but this "
                    f"model's vocabulary has {vocab_size} tokens: give 'tokens' (a list of ids) instead")
    states = states or RunStates({}, None, None, "float32")  # none registered, none saved
    try:
        initial = states.initial(item.state)
    except ValueError as e:
        return fail(str(e))
    tokens = tokenizer.encode(item.prompt) if item.prompt is not None else item.tokens
    if len(tokens) > args.max_prompt_tokens:
        return fail(f"{len(tokens)} prompt tokens exceed the limit {args.max_prompt_tokens} (--max-prompt-tokens)")
    return Request(str(item.line), list(tokens), params, initial_state=initial,
                   return_state=states.save_dir is not None, constraint=constraint)


class StopSignal:
    """SIGINT/SIGTERM: the first sets ``signum`` (stop admissions); a second raises KeyboardInterrupt.

    Called as ``should_stop()``: True once a signal came; the first such call prints the notice
    (not the handler itself, which may interrupt a write to stderr)."""

    def __init__(self, notify):
        self.signum: int | None = None
        self._notify = notify
        self._notified = False

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGINT/SIGTERM inside the block; the previous handlers come back after it."""
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __call__(self) -> bool:
        if self.signum is not None and not self._notified:
            self._notified = True
            self._notify(f"{signal.Signals(self.signum).name}: no new requests; finishing the in-flight "
                         "ones (signal again to stop now)")
        return self.signum is not None


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the run started: nothing in flight
        _say("interrupted before generation started; rerun the same command to start again")
        return 128 + signal.SIGINT


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    try:
        writer = ResultWriter(args.output)
    except (OSError, ValueError) as e:
        parser.error(f"--output {args.output}: {e}")
    with writer:
        if writer.torn_bytes:
            _say(f"cut a torn last line ({writer.torn_bytes} bytes) from {args.output}")
        if writer.records_before:
            _say(f"resuming: {writer.records_before} results already in {args.output}")
        model_path = Path(args.model) if args.model else random_model_path(args.random_model)
        sched = _schedulers(parser, args, model_path)
        try:
            states = _run_states(args, sched.engine)
        except ValueError as e:  # an unreadable state file, or one of another model shape
            parser.exit(EXIT_BAD_ARGS, f"rwkv7-generate: error: {e}\n")
        return _run(args, sched, sched.tokenizer, writer, states)


def _schedulers(parser, args, model_path: Path) -> SchedulerInterface:
    """One Scheduler, a ReplicaSet over the local devices, or Ray actors (``--data-parallel``,
    ``--ray``; rwkv7_apps/scheduler_setup.py), with the --prefix-cache-dir tier."""
    return build_scheduler(parser, args, model_path, lambda engine: _prefix_store(args, model_path, engine))


def _run_states(args, engine) -> RunStates:
    """The --state / --save-states options (the model's shape is read only when they are given)."""
    if not args.state and args.save_states is None:
        return RunStates({}, None, None, args.dtype)
    config = engine.config
    return RunStates(register_states(args.state or [], config, args.state_dtype), args.save_states, config,
                     args.dtype)


def _prefix_store(args, model_path: Path, engine):
    """The persistent prefix-cache tier of --prefix-cache-dir (None without it)."""
    if args.prefix_cache_dir is None:
        return None
    fingerprint = model_fingerprint(model_path, args.backend, engine, args.dtype, cache_dir(), args.quantization,
                                    args.group_size, args.state_dtype)
    return DiskPrefixStore(args.prefix_cache_dir, int(args.prefix_cache_disk_mb * 2**20), fingerprint)


def _run(args, sched: SchedulerInterface, tokenizer, writer: ResultWriter, states: RunStates | None = None) -> int:
    """Stream the input through the scheduler (``BatchRun``), then report; the exit status."""
    t0 = time.perf_counter()
    defaults = sampling_defaults(args)
    run: BatchRun
    stop = StopSignal(lambda message: run.bar.write(message))  # its notice goes above the progress bar
    run = BatchRun(sched, tokenizer, writer, args.input,
                   lambda item: make_request(item, defaults, args, sched.engine.vocab_size, tokenizer, states),
                   stop, lambda item, out: states.save(item.id, item.state, out), _say, args.max_line_bytes)
    try:
        with stop.installed():
            run.admit()
            sched.run(on_finish=run.on_finish, should_stop=stop)
    except KeyboardInterrupt:
        run.bar.close()
        writer.close()
        _say(f"stopped at once: {run.counts.total} results written this run; in-flight requests were dropped "
             "and will be redone when you rerun the same command")
        os._exit(128 + (stop.signum or signal.SIGINT))
    except SchedulerFailed as e:  # a dead prefill thread, every replica taken out
        run.bar.close()
        writer.sync()
        _say(f"{e}: {run.counts.total} results written this run; rerun the same command to do the rest")
        return 1
    run.bar.close()
    writer.sync()
    _report(args, sched, run, t0)
    if stop.signum is not None:
        _say(f"stopped by {signal.Signals(stop.signum).name}: results so far are in {args.output}; "
             f"rerun the same command to do the remaining requests")
        return 128 + stop.signum
    return 0


def _report(args, sched: SchedulerInterface, run, t0: float) -> None:
    """Print the summary table; write --metrics and --plot."""
    replicas = replica_reports(sched)
    metrics = build_metrics(sched.stats, run.counts, time.perf_counter() - t0, t0, run.skipped, replicas,
                            {"kernels": sched.engine.kernels, "dtype": sched.engine.dtype,
                             "state_dtype": args.state_dtype})
    print(summary_table(metrics), flush=True)
    if args.metrics:
        Path(args.metrics).write_text(json.dumps(metrics, indent=1) + "\n")
    if args.plot:
        plot_run(sched.stats, t0, args.plot, replicas)


def _say(message: str) -> None:
    print(f"rwkv7-generate: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
