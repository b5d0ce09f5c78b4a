"""Scheduler test and benchmark helpers: a fast numpy stand-in for a model engine (``FakeEngine``), a zero-cost
one (``CountingEngine``) and a soak driver (``soak``), for scheduler tests and benchmarks
(never used by the scheduler itself).

The "model" is a tiny recurrence: hidden h [D] float64, ``h = tanh(0.9 h + E[token])``,
logits = sum_d h[d] * P[d, :]. Its state row is ``[h (D), tokens seen, first prompt token]``.
Fault injection: a prompt starting with ``poison_token`` gets NaN logits once it has seen
``poison_after`` tokens; a prompt containing ``crash_token`` makes prefill raise; step number
i (counting from 0) raises when i is in ``fail_steps``. ``compile_seconds``: how long
``compile`` sleeps for each bucket it had not compiled (and reports). ``events`` logs every
call. ``CompilingEngine`` declares ``Capability.COMPILES`` and holds compiles back on demand.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Sequence

import numpy as np

from rwkv7_core.engine import Capability
from rwkv7_core.sampling import SamplingRows, banned_mask, sample_rows, sampling_rows, update_counts


class FakeEngine:
    capabilities = frozenset()
    config, dtype, kernels, device, prefill_pieces = None, "float64", "fake", None, ()  # no RWKV-7 model

    def __init__(self, vocab_size: int = 64, hidden: int = 8, seed: int = 0, *,
                 step_seconds: float = 0.0, prefill_seconds_per_token: float = 0.0,
                 poison_token: int | None = None, poison_after: int = 0,
                 crash_token: int | None = None, fail_steps: Sequence[int] = (),
                 compile_seconds: float = 0.0):
        rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.embed = rng.standard_normal((vocab_size, hidden))
        self.proj = rng.standard_normal((hidden, vocab_size)) * 2
        self.hidden = hidden
        self.step_seconds = step_seconds
        self.prefill_seconds_per_token = prefill_seconds_per_token
        self.poison_token, self.poison_after = poison_token, poison_after
        self.crash_token = crash_token
        self.fail_steps = set(fail_steps)
        self.compile_seconds = compile_seconds
        self.compiled: set[int] = set()
        self.bucket = 0
        self.last_path = "fake"
        self.events: list[tuple] = []
        self.steps_run = 0
        self._resize_arrays(0)

    def _resize_arrays(self, bucket: int) -> None:
        self.state = np.zeros((bucket, self.hidden + 2))
        self.counts = np.zeros((bucket, self.vocab_size), np.float32)
        self.banned = np.zeros((bucket, self.vocab_size), bool)
        self.rows = SamplingRows(*(np.zeros(bucket, a.dtype) for a in sampling_rows([])))

    # -- model ---------------------------------------------------------------------------
    def _advance(self, state: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """state [B, D+2] after one token per row."""
        out = state.copy()
        out[:, :self.hidden] = np.tanh(0.9 * state[:, :self.hidden] + self.embed[tokens])
        first = out[:, -2] == 0
        out[:, -1] = np.where(first, tokens, state[:, -1])
        out[:, -2] += 1
        return out

    def _logits(self, state: np.ndarray) -> np.ndarray:
        logits = (state[:, :self.hidden, None] * self.proj[None]).sum(axis=1).astype(np.float32)
        if self.poison_token is not None:
            bad = (state[:, -1] == self.poison_token) & (state[:, -2] >= self.poison_after)
            logits[bad] = np.nan
        return logits

    # -- Engine protocol -----------------------------------------------------------------
    def compile(self, buckets):
        self.events.append(("compile", tuple(buckets)))
        seconds = {b: 0.0 if b in self.compiled else self.compile_seconds for b in buckets}
        time.sleep(sum(seconds.values()))
        self.compiled.update(buckets)
        return seconds

    def compile_prefill(self):
        return {}

    def prefill(self, tokens, start=None):
        tokens = np.asarray(tokens)
        if self.crash_token is not None and (tokens == self.crash_token).any():
            raise RuntimeError("injected prefill crash")
        if self.prefill_seconds_per_token:
            time.sleep(self.prefill_seconds_per_token * len(tokens))
        state = np.zeros((1, self.hidden + 2)) if start is None else start[0][None].copy()
        for t in tokens:
            state = self._advance(state, np.array([t]))
        return state[0], self._logits(state)[0]

    def sample(self, row, params, position=0):
        logits = row[1][None]
        return int(sample_rows(logits, np.zeros_like(logits), sampling_rows([params]),
                               banned_mask([params], self.vocab_size), np.array([position]))[0])

    def insert(self, slot, row, params):
        self.events.append(("insert", slot))
        self.state[slot] = row[0]
        self.counts[slot] = 0
        self.banned[slot] = banned_mask([params], self.vocab_size)[0]
        for name, value in sampling_rows([params])._asdict().items():
            getattr(self.rows, name)[slot] = value[0]

    def extract(self, slot):
        return self.state[slot].copy(), None

    def resize(self, keep_slots, new_bucket):
        self.events.append(("resize", self.bucket, new_bucket, tuple(keep_slots)))
        keep = list(keep_slots)
        old = (self.state, self.counts, self.banned, self.rows)
        self._resize_arrays(new_bucket)
        self.state[:len(keep)] = old[0][keep]
        self.counts[:len(keep)] = old[1][keep]
        self.banned[:len(keep)] = old[2][keep]
        for new, prev in zip(self.rows, old[3]):
            new[:len(keep)] = prev[keep]
        self.bucket = new_bucket

    def step(self, tokens, positions):
        index = self.steps_run
        self.steps_run += 1
        self.events.append(("step", self.bucket))
        if index in self.fail_steps:
            raise RuntimeError(f"injected failure at step {index}")
        if self.step_seconds:
            time.sleep(self.step_seconds)
        tokens = np.asarray(tokens)
        self.counts = update_counts(self.counts, tokens, self.rows.decay)
        self.state = self._advance(self.state, tokens)
        return sample_rows(self._logits(self.state), self.counts, self.rows, self.banned,
                           np.asarray(positions))

    def to_host(self, row):
        return tuple(None if a is None else np.array(a) for a in row)

    def from_host(self, host_row):
        return tuple(None if a is None else np.array(a) for a in host_row)


class CompilingEngine(FakeEngine):
    """A FakeEngine that declares ``Capability.COMPILES``, as a JIT engine would: ``compile``
    of a bucket in ``held`` blocks (in whichever thread called it) until ``release(bucket)``;
    a bucket in ``fail_compiles`` raises RuntimeError when compiled. It checks its use:
    stepping, inserting into or resizing to a bucket, or resizing between two buckets (with
    rows kept), that ``compile`` has not returned for raises RuntimeError ("... not
    compiled"). ``compile_threads``: (thread name, buckets) of every compile call."""
    capabilities = frozenset({Capability.COMPILES})

    def __init__(self, *args, held: Sequence[int] = (), fail_compiles: Sequence[int] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.gates = {b: threading.Event() for b in held}
        self.fail_compiles = set(fail_compiles)
        self.pairs: set[tuple[int, int]] = set()
        self.compile_threads: list[tuple[str, tuple[int, ...]]] = []
        self._compile_lock = threading.Lock()

    def release(self, bucket: int) -> None:
        self.gates[bucket].set()

    def compile(self, buckets):
        self.compile_threads.append((threading.current_thread().name, tuple(buckets)))
        for b in buckets:
            if b in self.gates:
                self.gates[b].wait()
            if b in self.fail_compiles:
                raise RuntimeError(f"injected compile failure of bucket {b}")
        with self._compile_lock:
            seconds = super().compile(buckets)
            self.pairs.update((a, b) for a in buckets for b in buckets)
        return seconds

    def _check(self, bucket: int, what: str) -> None:
        if bucket not in self.compiled:
            raise RuntimeError(f"{what} in bucket {bucket}, not compiled")

    def resize(self, keep_slots, new_bucket):
        self._check(new_bucket, "resize")
        if keep_slots and (self.bucket, new_bucket) not in self.pairs:
            raise RuntimeError(f"resize {self.bucket} -> {new_bucket} not compiled")
        super().resize(keep_slots, new_bucket)

    def insert(self, slot, row, params):
        self._check(self.bucket, "insert")
        super().insert(slot, row, params)

    def step(self, tokens, positions):
        self._check(self.bucket, "step")
        return super().step(tokens, positions)


def reference_decode(engine: FakeEngine, prompt: Sequence[int], params, max_tokens: int | None = None):
    """Tokens the request would produce alone, one token at a time (no scheduler)."""
    state, logits = engine.prefill(np.asarray(prompt))
    rows = sampling_rows([params])
    banned = banned_mask([params], engine.vocab_size)
    counts = np.zeros((1, engine.vocab_size), np.float32)
    out: list[int] = []
    limit = params.max_tokens if max_tokens is None else max_tokens
    state = state[None]
    logits = logits[None]
    while len(out) < limit:
        token = int(sample_rows(logits, counts, rows, banned, np.array([len(out)]))[0])
        if token < 0 or token in params.stop_tokens:
            break
        out.append(token)
        counts = update_counts(counts, np.array([token]), rows.decay)
        state = engine._advance(state, np.array([token]))
        logits = engine._logits(state)
    return out


class CountingEngine:
    """A zero-cost engine for soak tests of the scheduler itself (memory, bookkeeping):
    no model and no sampling. A row is the prompt's token sum; the first token is
    1 + (sum + seed) % (V - 1) and every later one is 1 + (last % (V - 1)) (never 0, the
    default stop token), so each request runs to max_tokens. Implements ``Engine`` with
    ``Capability.VARLEN_PREFILL``; ``expected_tokens(prompt, params)`` gives a request's output."""
    capabilities = frozenset({Capability.VARLEN_PREFILL})
    config, dtype, kernels, device, prefill_pieces = None, "int64", "counting", None, ()  # no RWKV-7 model

    def __init__(self, vocab_size: int = 64):
        self.vocab_size = vocab_size
        self.bucket = 0
        self.last_path = "counting"

    def compile(self, buckets):
        return {b: 0.0 for b in buckets}

    def compile_prefill(self):
        return {}

    def compile_varlen(self, token_rows):
        return 0.0

    def prefill(self, tokens, start=None):
        return (0 if start is None else start[0]) + int(np.sum(tokens)), None

    def prefill_varlen(self, prompts, starts, token_rows):
        return [self.prefill(p, s) for p, s in zip(prompts, starts)]

    def sample(self, row, params, position=0):
        return 1 + (row[0] + params.seed) % (self.vocab_size - 1)

    def expected_tokens(self, prompt: Sequence[int], params) -> list[int]:
        out = [self.sample((int(sum(prompt)), None), params)]
        while len(out) < params.max_tokens:
            out.append(1 + out[-1] % (self.vocab_size - 1))
        return out

    def insert(self, slot, row, params):
        pass

    def extract(self, slot):
        return 0, None

    def resize(self, keep_slots, new_bucket):
        self.bucket = new_bucket

    def step(self, tokens, positions):
        return (1 + np.asarray(tokens) % (self.vocab_size - 1)).astype(np.int32)

    def to_host(self, row):
        return (np.array(row[0]),)

    def from_host(self, host_row):
        return int(host_row[0]), None


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc; elsewhere the peak, from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def soak(scheduler, n: int, checkpoints: Sequence[int] = (), window: int = 512, check_every: int = 997,
         on_checkpoint=None) -> np.ndarray:
    """Stream ``n`` requests (ids "0".."n-1", prompts of 1-8 tokens, 1-8 output tokens) through
    ``scheduler`` (on a ``CountingEngine``) with at most ``window`` in flight, as the batch
    command does. Every result is checked on arrival: its id is new, it ran to max_tokens, and
    every ``check_every``-th one's tokens equal ``expected_tokens``. ``on_checkpoint(done)``
    runs when ``done`` results have arrived, for each done in checkpoints. Returns the number
    of times each id finished (int8 [n])."""
    from rwkv7_core.sampling import SamplingParams
    from scheduler.request import Request

    engine = scheduler.engine
    finished = np.zeros(n, np.int8)
    marks = sorted(checkpoints)
    state = {"next": 0, "in_flight": 0, "done": 0, "bad": None}

    def request(i: int) -> Request:
        prompt = [1 + (i * 7 + k) % (engine.vocab_size - 1) for k in range(1 + i % 8)]
        return Request(str(i), prompt, SamplingParams(max_tokens=1 + (i * 5) % 8, stop_tokens=(), seed=i))

    def admit() -> None:
        while state["in_flight"] < window and state["next"] < n:
            scheduler.add(request(state["next"]))
            state["next"] += 1
            state["in_flight"] += 1

    def on_finish(out) -> None:
        i = int(out.id)
        finished[i] += 1
        state["in_flight"] -= 1
        state["done"] += 1
        want = request(i)
        if out.generated_tokens != want.params.max_tokens or (
                i % check_every == 0 and out.tokens != engine.expected_tokens(want.prompt_tokens, want.params)):
            state["bad"] = state["bad"] or f"request {i}: {out.finish_reason} {out.tokens}"
        while marks and state["done"] >= marks[0]:
            marks.pop(0)
            if on_checkpoint is not None:
                on_checkpoint(state["done"])
        admit()

    admit()
    scheduler.run(on_finish=on_finish)
    if state["bad"] is not None:
        raise AssertionError(f"wrong result: {state['bad']}")
    return finished
