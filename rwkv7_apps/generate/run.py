"""One ``rwkv7-generate`` run's flow of requests: input lines into the scheduler through a
bounded window, each result written as it finishes.

At most ``2 * max_batch`` requests are queued or in flight, so memory stays flat and TTFT
measures service, not the input's length; a bad line gets its error record on the way.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterator

from tqdm import tqdm

from .jsonl_io import MAX_LINE_BYTES, InputError, InputRequest, ResultWriter, error_record, read_requests
from .metrics import RunCounts


class BatchRun:
    """Feeds ``input_path``'s unfinished lines to ``sched`` and writes its results.

    ``to_request(item)``: an InputRequest as a scheduler Request, or an InputError;
    ``should_stop()``: no more input is admitted once True; ``save_state(item, out)``: the
    path of a result's final state file (OSError / ValueError when it cannot be written);
    ``say(message)``: a notice; ``max_line_bytes``: the longest input line read (a longer one
    gets an error record). ``counts``: the results written so far (RunCounts);
    ``skipped``: input lines already in the output."""

    def __init__(self, sched, tokenizer, writer: ResultWriter, input_path: str, to_request: Callable,
                 should_stop: Callable[[], bool], save_state: Callable, say: Callable[[str], None],
                 max_line_bytes: int = MAX_LINE_BYTES):
        self.sched, self.tokenizer, self.writer = sched, tokenizer, writer
        self.to_request, self.should_stop, self.save_state, self.say = to_request, should_stop, save_state, say
        self.counts = RunCounts()  # per-request figures live in the scheduler's bounded Stats
        self.skipped, self.max_line_bytes = 0, max_line_bytes
        self.window = 2 * sched.config.max_batch
        self.in_scheduler: dict[str, InputRequest] = {}
        self.todo = self._unfinished(input_path)
        self.bar = tqdm(total=max(0, _count_lines(input_path) - len(writer.done)), file=sys.stderr, unit="req",
                        dynamic_ncols=True, desc="generate")
        self._rate = {"tokens": 0, "since": time.perf_counter()}

    def admit(self) -> None:
        """Add input lines until the window is full (error records for bad lines on the way)."""
        while len(self.in_scheduler) < self.window and not self.should_stop():
            item = next(self.todo, None)
            if item is None:
                return
            if isinstance(item, InputRequest):
                request = self.to_request(item)
                if not isinstance(request, InputError):
                    self.in_scheduler[request.id] = item
                    self.sched.add(request)
                    continue
                item = request
            self._write(error_record(item))

    def on_finish(self, out) -> None:
        """The scheduler's ``on_finish``: write the result (cancelled = never started: the
        next run does it), admit more input, show the rate."""
        item = self.in_scheduler.pop(out.id)
        if out.finish_reason != "cancelled":
            record = result_record(item, out, self.tokenizer)
            if out.final_state is not None:  # written before its record, so a resume never misses it
                try:
                    record["state_file"] = str(self.save_state(item, out))
                except (OSError, ValueError) as e:
                    record.update(finish_reason="error", error=f"line {item.line}: could not save the state: {e}")
            self._write(record)
        self.admit()
        self._show_rate()

    def _unfinished(self, input_path: str) -> Iterator[InputRequest | InputError]:
        """Input items without a result in the output yet (one streaming pass)."""
        for item in read_requests(input_path, skip=self.writer.done, max_line_bytes=self.max_line_bytes):
            if item is None:
                self.skipped += 1
            else:
                yield item
        if self.skipped:
            self.say(f"skipping {self.skipped} input lines already in {self.writer.path}")

    def _write(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        self.counts.add(record)
        self.bar.update(1)

    def _show_rate(self) -> None:
        now, rate = time.perf_counter(), self._rate
        if now - rate["since"] >= 0.5:
            tokens = self.counts.generated_tokens
            self.bar.set_postfix(in_flight=len(self.in_scheduler),
                                 tok_s=f"{(tokens - rate['tokens']) / (now - rate['since']):.0f}", refresh=False)
            rate["tokens"], rate["since"] = tokens, now


def _count_lines(path: str) -> int:
    """Newlines in the file (the progress bar's total: one pass, no parsing)."""
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def result_record(item: InputRequest, out, tokenizer) -> dict[str, Any]:
    """The output line of a request the scheduler finished."""
    record: dict[str, Any] = {"id": item.id, "tokens": list(out.tokens)}
    if tokenizer is not None:
        record["text"] = tokenizer.decode(out.tokens)
    record["finish_reason"] = out.finish_reason
    if out.error is not None:
        record["error"] = f"line {item.line}: {out.error}"
    record["prompt_tokens"] = out.prompt_tokens
    record["generated_tokens"] = out.generated_tokens
    return record
