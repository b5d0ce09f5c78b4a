"""`JaxEngine`: the scheduler's Engine protocol (scheduler/engine.py) on a `rwkv_jax.Model`.

Device-resident batch ("slots", donated through every step): the recurrent State [bucket, ...],
penalty counts float32 [bucket, V], banned-token mask bool [bucket, V] and per-slot sampling
parameters (SamplingRows of [bucket] arrays). One decode step is one jitted call: count the
fed tokens, run ``forward_fn`` (T=1, kernel path ``select_path(bucket, 1)``) and sample every
row on device; only the drawn int32 [bucket] tokens come back to the host.

Every executable is compiled ahead of time and cached per shape: per bucket the step, the
empty batch, the slot insert and the slot extract; per pair of buckets the gather used by
``resize`` (so a shrink never waits on a compile); per
prompt piece length the prefill: a prompt of T tokens runs as pieces of the allowed lengths
``prefill_pieces`` (default 1, 2, 4, ..., 256), largest first, so any T needs at most
len(prefill_pieces) prefill executables.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scheduler.params import SamplingParams
from scheduler.sampling import SamplingRows, banned_mask, sampling_rows

from .forward import forward_fn
from .paths import select_path
from .sampling import sample_rows, update_counts
from .state import State


class Slots(NamedTuple):
    """The batch the engine owns; every leaf has a leading [bucket] axis."""
    state: State
    counts: jax.Array   # float32 [B, V]
    banned: jax.Array   # bool [B, V]
    rows: SamplingRows  # [B] arrays


def _decode_step(params, slots: Slots, tokens, positions, *, config, path, kernels):
    counts = update_counts(slots.counts, tokens, slots.rows.decay)
    logits, state = forward_fn(params, tokens[:, None], slots.state, config=config, path=path, kernels=kernels)
    drawn = sample_rows(logits, counts, slots.rows, slots.banned, positions)
    return drawn, slots._replace(state=state, counts=counts)


def _prefill(params, tokens, state, *, config, path, kernels):
    logits, state = forward_fn(params, tokens[None], state, config=config, path=path, kernels=kernels)
    return logits[0], state


def _sample_one(logits, rows, banned, position):
    return sample_rows(logits[None], jnp.zeros_like(banned, jnp.float32), rows, banned, position)[0]


def _insert(slots: Slots, slot, state: State, rows: SamplingRows, banned) -> Slots:
    def put(big, small):
        return jax.lax.dynamic_update_index_in_dim(big, small.astype(big.dtype), slot, 0)
    return Slots(state=jax.tree.map(put, slots.state, state),
                 counts=put(slots.counts, jnp.zeros_like(slots.counts[:1])),
                 banned=put(slots.banned, banned),
                 rows=jax.tree.map(put, slots.rows, rows))


def _extract(state: State, slot) -> State:
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, slot, 0), state)


def _gather(slots: Slots, index) -> Slots:
    return jax.tree.map(lambda x: jnp.take(x, index, axis=0), slots)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


class JaxEngine:
    """Engine protocol implementation for a loaded ``rwkv_jax.Model``.

    Rows (``prefill``/``extract`` results) are ``(State with B=1, logits float32 [V] | None)``;
    host rows are the numpy copies of the same leaves. ``compile_seconds`` maps
    (kind, shape) -> seconds for every executable compiled.
    """

    def __init__(self, model, prefill_pieces: Sequence[int] = tuple(1 << i for i in range(9))):
        if 1 not in prefill_pieces:
            raise ValueError(f"prefill_pieces={tuple(prefill_pieces)} must include 1")
        self.model = model
        self.config = model.config
        self.vocab_size = model.config.vocab_size
        self.pieces = tuple(sorted(set(int(p) for p in prefill_pieces), reverse=True))
        self.bucket = 0
        self.last_path = ""
        self.slots: Slots | None = None
        self.compile_seconds: dict[tuple, float] = {}
        self._exes: dict[tuple, object] = {}
        self._exe_lock = threading.Lock()
        self._key_locks: dict[tuple, threading.Lock] = {}
        static = dict(config=self.config, kernels=model.kernels)
        self._jit_step = jax.jit(_decode_step, static_argnames=("config", "path", "kernels"),
                                 donate_argnames=("slots",))
        self._jit_prefill = jax.jit(_prefill, static_argnames=("config", "path", "kernels"),
                                    donate_argnames=("state",))
        self._jit_sample = jax.jit(_sample_one)
        self._jit_insert = jax.jit(_insert, donate_argnames=("slots",))
        self._jit_extract = jax.jit(_extract)
        self._jit_gather = jax.jit(_gather)
        self._jit_empty = jax.jit(self._empty_slots, static_argnums=0)
        self._static = static

    # -- executables ---------------------------------------------------------------------
    def _executable(self, kind: str, shape, lower):
        """The compiled executable for (kind, shape), compiling (and timing) it on first use."""
        key = (kind, shape)
        exe = self._exes.get(key)
        if exe is None:
            with self._exe_lock:  # one lock per key: the prefill worker and the decode loop
                key_lock = self._key_locks.setdefault(key, threading.Lock())  # compile side by side
            with key_lock:
                exe = self._exes.get(key)
                if exe is None:
                    start = time.perf_counter()
                    exe = lower().compile()
                    self.compile_seconds[key] = time.perf_counter() - start
                    self._exes[key] = exe
        return exe

    def _empty_slots(self, bucket: int) -> Slots:
        V = self.vocab_size
        rows = SamplingRows(*(jnp.zeros((bucket,), a.dtype) for a in sampling_rows([])))
        return Slots(self.model.init_state(bucket), jnp.zeros((bucket, V), jnp.float32),
                     jnp.zeros((bucket, V), jnp.bool_), rows)

    def _empty_exe(self, bucket: int):
        return self._executable("empty", bucket, lambda: self._jit_empty.lower(bucket))

    def _abstract_slots(self, bucket: int) -> Slots:
        V = self.vocab_size
        state = jax.eval_shape(lambda: self.model.init_state(bucket))
        rows = SamplingRows(*(jax.ShapeDtypeStruct((bucket,), a.dtype) for a in sampling_rows([])))
        return Slots(_abstract(state), jax.ShapeDtypeStruct((bucket, V), jnp.float32),
                     jax.ShapeDtypeStruct((bucket, V), jnp.bool_), rows)

    def _step_exe(self, bucket: int):
        def lower():
            vec = jax.ShapeDtypeStruct((bucket,), jnp.int32)
            return self._jit_step.lower(self.model.params, self._abstract_slots(bucket), vec, vec,
                                        path=select_path(bucket, 1), **self._static)
        return self._executable("step", bucket, lower)

    def _insert_exe(self, bucket: int):
        def lower():
            one = self._abstract_slots(1)
            return self._jit_insert.lower(self._abstract_slots(bucket), jax.ShapeDtypeStruct((), jnp.int32),
                                          one.state, one.rows, one.banned)
        return self._executable("insert", bucket, lower)

    def _extract_exe(self, bucket: int):
        def lower():
            return self._jit_extract.lower(self._abstract_slots(bucket).state,
                                           jax.ShapeDtypeStruct((), jnp.int32))
        return self._executable("extract", bucket, lower)

    def _gather_exe(self, old: int, new: int):
        def lower():
            return self._jit_gather.lower(self._abstract_slots(old), jax.ShapeDtypeStruct((new,), jnp.int32))
        return self._executable("gather", (old, new), lower)

    def _prefill_exe(self, T: int):
        def lower():
            state = _abstract(jax.eval_shape(lambda: self.model.init_state(1)))
            return self._jit_prefill.lower(self.model.params, jax.ShapeDtypeStruct((T,), jnp.int32), state,
                                           path=select_path(1, T), **self._static)
        return self._executable("prefill", T, lower)

    def _sample_exe(self):
        def lower():
            one = self._abstract_slots(1)
            return self._jit_sample.lower(jax.ShapeDtypeStruct((self.vocab_size,), jnp.float32), one.rows,
                                          one.banned, jax.ShapeDtypeStruct((1,), jnp.int32))
        return self._executable("sample", 1, lower)

    def prefill_pieces(self, T: int) -> list[int]:
        """Piece lengths a T-token prompt runs as: the largest allowed length that fits, repeatedly."""
        pieces = []
        while T:
            piece = next(p for p in self.pieces if p <= T)
            pieces.append(piece)
            T -= piece
        return pieces

    # -- Engine protocol -----------------------------------------------------------------
    def compile(self, buckets: Sequence[int]) -> dict[int, float]:
        """Compile step/empty/insert/extract for each bucket and the resize gathers between it
        and every bucket compiled before, then run each new executable once on scratch data
        (an executable's first run pays one-off set-up, tens of ms on CPU, which would
        otherwise land on the first step after a bucket switch). Returns {bucket: seconds}."""
        seconds = {}
        for b in buckets:
            start = time.perf_counter()
            before = set(self._exes)
            self._step_exe(b)
            self._empty_exe(b)
            self._insert_exe(b)
            self._extract_exe(b)
            for other in {k[1] for k in list(self._exes) if k[0] == "step"} - {b}:
                self._gather_exe(other, b)
                self._gather_exe(b, other)
            new = set(self._exes) - before
            if new:
                self._warm_up(new)
            seconds[b] = time.perf_counter() - start if new else 0.0
        return seconds

    def _warm_up(self, keys) -> None:
        """Run the executables named by keys once on scratch slots."""
        one = self._empty_exe(1)()
        outputs = []
        for kind, shape in keys:
            exe = self._exes[(kind, shape)]
            if kind == "step":
                zeros = np.zeros(shape, np.int32)
                outputs.append(exe(self.model.params, self._empty_exe(shape)(), zeros, zeros))
            elif kind == "empty":
                outputs.append(exe())
            elif kind == "insert":
                outputs.append(exe(self._empty_exe(shape)(), np.int32(0), one.state, one.rows, one.banned))
            elif kind == "extract":
                outputs.append(exe(self._empty_exe(shape)().state, np.int32(0)))
            elif kind == "gather":
                outputs.append(exe(self._empty_exe(shape[0])(), np.zeros(shape[1], np.int32)))
        jax.block_until_ready(outputs)

    def compile_prefill(self) -> dict[int, float]:
        """Compile every prefill piece length and the first-token sampling; {length: seconds}."""
        self._sample_exe()
        return {T: (self._prefill_exe(T), self.compile_seconds[("prefill", T)])[1] for T in self.pieces}

    def prefill(self, tokens: np.ndarray, start=None):
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError(f"prefill needs a non-empty 1-D token array, got shape {tokens.shape}")
        state = self.model.init_state(1) if start is None else jax.tree.map(jnp.copy, start[0])
        offset = 0
        for piece in self.prefill_pieces(tokens.size):
            logits, state = self._prefill_exe(piece)(self.model.params, tokens[offset:offset + piece], state)
            offset += piece
        return state, logits

    def sample(self, row, params: SamplingParams, position: int = 0) -> int:
        return int(self._sample_exe()(row[1], sampling_rows([params]), banned_mask([params], self.vocab_size),
                                      np.array([position], np.int32)))

    def insert(self, slot: int, row, params: SamplingParams) -> None:
        self._check_slot(slot)
        self.slots = self._insert_exe(self.bucket)(self.slots, np.int32(slot), row[0], sampling_rows([params]),
                                                   banned_mask([params], self.vocab_size))

    def extract(self, slot: int):
        self._check_slot(slot)
        return self._extract_exe(self.bucket)(self.slots.state, np.int32(slot)), None

    def resize(self, keep_slots: Sequence[int], new_bucket: int) -> None:
        keep = list(keep_slots)
        if len(keep) > new_bucket or any(not 0 <= s < self.bucket for s in keep):
            raise ValueError(f"cannot keep slots {keep} of bucket {self.bucket} in bucket {new_bucket}")
        if self.slots is None or not keep:  # nothing to keep: a fresh batch (also recovers
            self.slots = self._empty_exe(new_bucket)()  # from a failed step's donated buffers)
        else:
            index = np.array(keep + [0] * (new_bucket - len(keep)), np.int32)
            self.slots = self._gather_exe(self.bucket, new_bucket)(self.slots, index)
        self.bucket = new_bucket

    def step(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        exe = self._step_exe(self.bucket)
        drawn, self.slots = exe(self.model.params, self.slots, np.asarray(tokens, np.int32),
                                np.asarray(positions, np.int32))
        self.last_path = select_path(self.bucket, 1).name
        return np.asarray(drawn)

    def to_host(self, row):
        return tuple(jax.device_get(row[0])) + (None if row[1] is None else np.asarray(row[1]),)

    def from_host(self, host_row):
        *state, logits = host_row
        return State(*(jnp.asarray(a) for a in state)), (None if logits is None else jnp.asarray(logits))

    # -- VARLEN / MIXED prefill policies (rwkv_jax/varlen_engine.py) ---------------------
    def prefill_varlen(self, prompts: Sequence[np.ndarray], starts: Sequence,
                       token_rows: int | None = None) -> list:
        """Prompt pieces (int [T_i] each, 1..MAX_PIECES) in one flattened forward (padded to
        ``token_rows`` tokens), piece i continuing from starts[i] (a Row, or None = fresh);
        returns one Row per piece."""
        return self._varlen().prefill_varlen(prompts, starts, token_rows)

    def mixed_step(self, tokens: np.ndarray, positions: np.ndarray, prompts: Sequence[np.ndarray],
                   starts: Sequence, token_rows: int | None = None) -> tuple[np.ndarray, list]:
        """``step`` for every slot plus prompt pieces (padded to ``token_rows`` tokens) in the
        same forward; returns (drawn int32 [bucket], one Row per piece)."""
        return self._varlen().mixed_step(tokens, positions, prompts, starts, token_rows)

    def _varlen(self):
        if getattr(self, "_varlen_runner", None) is None:
            from .varlen_engine import VarlenRunner
            self._varlen_runner = VarlenRunner(self)
        return self._varlen_runner

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.bucket:
            raise ValueError(f"slot {slot} outside the current bucket of {self.bucket}")
