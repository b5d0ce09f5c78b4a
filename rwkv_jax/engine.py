"""`JaxEngine`: the engine contract (rwkv7_core/engine.py) on a `rwkv_jax.Model`.

Device-resident batch ("slots", donated through every step): the recurrent State [bucket, ...],
penalty counts float32 [bucket, V], banned-token mask bool [bucket, V] and per-slot sampling
parameters (SamplingRows of [bucket] arrays). One decode step is one jitted call: count the
fed tokens, run ``forward_fn`` (T=1, kernel path ``select_path(bucket, 1)``) and sample every
row on device; only the drawn int32 [bucket] tokens come back to the host.

Every executable is compiled ahead of time and kept in the engine's one ``executables``
cache, keyed (kind, shape): per bucket the step, the empty batch, the slot insert and the
slot extract; a fresh and a copied B=1 row (the starts of prefill); per pair of buckets the
gather used by ``resize`` (compiled with the buckets when they are compiled together, as
``--precompile`` does, else by the first resize between them); per prompt piece length the
prefill: a prompt of T tokens runs as pieces of the allowed lengths ``prefill_pieces``
(default 1, 2, 4, ..., 256), largest first, so any T needs at most len(prefill_pieces)
prefill executables; per flat size the varlen prefill and per (bucket, flat size) the mixed
step (Capability.VARLEN_PREFILL, MIXED_STEP); for Capability.LOGPROBS, compiled on first
use: per bucket the step that also scores the drawn tokens, the first-token scoring, and
per piece length the full-output prompt scoring (the plain step stays as lean as before).
"""
from __future__ import annotations

import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rwkv7_core.engine import MAX_PIECES, Capability, Slots
from rwkv7_core.sampling import SamplingParams, SamplingRows, TokenLogprobs, banned_mask, sampling_rows

from .compilation import ExecutableCache
from .forward import forward_fn
from .model import abstract
from .paths import Path, select_path
from .sampling import sample_rows, token_logprobs, update_counts
from .state import State
from .varlen_engine import mixed_step_fn, pack_pieces, varlen_prefill_fn


def _decode_step(params, slots: Slots, tokens, positions, *, config, path, kernels, with_logprobs=False):
    """(drawn int32 [B], TokenLogprobs of them or None, new slots)."""
    counts = update_counts(slots.counts, tokens, slots.rows.decay)
    logits, state = forward_fn(params, tokens[:, None], slots.state, config=config, path=path, kernels=kernels)
    drawn = sample_rows(logits, counts, slots.rows, slots.banned, positions)
    scored = token_logprobs(logits, drawn) if with_logprobs else None
    return drawn, scored, slots._replace(state=state, counts=counts)


def _score_piece(params, tokens, next_tokens, state, *, config, path, kernels):
    """Full-output prefill of one piece: TokenLogprobs of next_tokens [T] under the logits
    after each token of tokens [T], and the state after the piece."""
    logits, state = forward_fn(params, tokens[None], state, config=config, path=path, kernels=kernels,
                               full_output=True)
    return token_logprobs(logits.reshape(tokens.shape[0], -1), next_tokens), state  # [1, V] when T = 1


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


class JaxEngine:
    """Engine contract (with every ``Capability``: varlen prefill, mixed step, logprobs and
    compile reports) for a loaded ``rwkv_jax.Model``.

    Rows (``prefill``/``extract`` results) are ``(State with B=1, logits float32 [V] | None)``;
    host rows are the numpy copies of the same leaves. ``executables`` is the one cache of
    compiled executables, keyed (kind, shape); ``lower(key)`` gives a key's jax.stages.Lowered.
    ``device``: the model's device (None = JAX's default), where the batch lives.
    """

    capabilities = frozenset(Capability)

    def __init__(self, model, prefill_pieces: Sequence[int] = tuple(1 << i for i in range(9))):
        if 1 not in prefill_pieces:
            raise ValueError(f"prefill_pieces={tuple(prefill_pieces)} must include 1")
        self.model = model
        self.device = model.device
        self.config = model.config
        self.vocab_size = model.config.vocab_size
        self.pieces = tuple(sorted(set(int(p) for p in prefill_pieces), reverse=True))
        self.bucket = 0
        self.last_path = ""
        self.slots: Slots | None = None
        self.executables = ExecutableCache(self.lower, model.executables.options)
        self._static = dict(config=self.config, kernels=model.kernels)
        static_path = ("config", "path", "kernels")
        self._jit = {
            "step": jax.jit(_decode_step, static_argnames=static_path, donate_argnames=("slots",)),
            "step_logprobs": jax.jit(functools.partial(_decode_step, with_logprobs=True),
                                     static_argnames=static_path, donate_argnames=("slots",)),
            "score_piece": jax.jit(_score_piece, static_argnames=static_path, donate_argnames=("state",)),
            "row_logprobs": jax.jit(token_logprobs),
            "prefill": jax.jit(_prefill, static_argnames=static_path, donate_argnames=("state",)),
            "sample": jax.jit(_sample_one),
            "insert": jax.jit(_insert, donate_argnames=("slots",)),
            "extract": jax.jit(_extract),
            "gather": jax.jit(_gather),
            "empty": jax.jit(self._empty_slots, static_argnums=0),
            "fresh_row": jax.jit(lambda: self.model.init_state(1)),
            "copy_row": jax.jit(lambda state: jax.tree.map(jnp.copy, state)),
            "varlen_prefill": jax.jit(varlen_prefill_fn, static_argnames=("config", "kernels")),
            "mixed": jax.jit(mixed_step_fn, static_argnames=("config", "kernels"), donate_argnames=("slots",)),
        }
        self._zero_row = None

    def add_compile_listener(self, listener) -> None:
        """Capability.REPORTS_COMPILES: ``listener(what, start, seconds)`` after every compile and every
        executable's first run, ``what`` = "kind:shape" of the executable (e.g. "step:8",
        "gather:(8, 4)", "prefill:64"), with " first run" appended for the latter."""
        def report(key, phase, start, seconds):
            listener(f"{key[0]}:{key[1]}" + ("" if phase == "compile" else f" {phase}"), start, seconds)
        self.executables.add_listener(report)

    @property
    def compile_seconds(self) -> dict:
        """{(kind, shape): seconds} of every executable compiled so far."""
        return self.executables.compile_seconds

    # -- executables ---------------------------------------------------------------------
    def lower(self, key: tuple):
        """The jax.stages.Lowered executable for key = (kind, shape) (see the module doc),
        placed on the model's device."""
        with self.model.on_device():
            return self._lower(key)

    def _lower(self, key: tuple):
        kind, shape = key
        jit, params, i32 = self._jit[kind], self.model.params, jnp.int32
        vec = lambda n: jax.ShapeDtypeStruct((n,), i32)  # noqa: E731
        scalar = jax.ShapeDtypeStruct((), i32)
        one = self.abstract_slots(1)
        if kind in ("step", "step_logprobs"):
            return jit.lower(params, self.abstract_slots(shape), vec(shape), vec(shape),
                             path=select_path(shape, 1), **self._static)
        if kind == "score_piece":
            return jit.lower(params, vec(shape), vec(shape), one.state, path=select_path(1, shape), **self._static)
        if kind == "row_logprobs":
            return jit.lower(jax.ShapeDtypeStruct((1, self.vocab_size), jnp.float32), vec(1))
        if kind == "empty":
            return jit.lower(shape)
        if kind == "fresh_row":
            return jit.lower()
        if kind == "copy_row":
            return jit.lower(one.state)
        if kind == "insert":
            return jit.lower(self.abstract_slots(shape), scalar, one.state, one.rows, one.banned)
        if kind == "extract":
            return jit.lower(self.abstract_slots(shape).state, scalar)
        if kind == "gather":
            return jit.lower(self.abstract_slots(shape[0]), vec(shape[1]))
        if kind == "prefill":
            return jit.lower(params, vec(shape), one.state, path=select_path(1, shape), **self._static)
        if kind == "sample":
            return jit.lower(jax.ShapeDtypeStruct((self.vocab_size,), jnp.float32), one.rows, one.banned, vec(1))
        if kind == "varlen_prefill":
            return jit.lower(params, vec(shape), (one.state,) * MAX_PIECES, vec(MAX_PIECES), vec(MAX_PIECES),
                             **self._static)
        if kind == "mixed":
            bucket, token_rows = shape
            return jit.lower(params, self.abstract_slots(bucket), vec(bucket), vec(bucket), vec(token_rows),
                             (one.state,) * MAX_PIECES, vec(MAX_PIECES), vec(MAX_PIECES), **self._static)
        raise ValueError(f"unknown executable kind {kind!r}")

    def _exe(self, kind: str, shape):
        """The executable of (kind, shape) as a callable; its first run counts as compiling."""
        return functools.partial(self.executables.call, (kind, shape))

    def _compile(self, kind: str, shape) -> None:
        self.executables.get((kind, shape))

    def abstract_slots(self, bucket: int) -> Slots:
        """Slots of ``bucket`` rows as ShapeDtypeStructs."""
        V = self.vocab_size
        state = abstract(jax.eval_shape(lambda: self.model.init_state(bucket)))
        rows = SamplingRows(*(jax.ShapeDtypeStruct((bucket,), a.dtype) for a in sampling_rows([])))
        return Slots(state, jax.ShapeDtypeStruct((bucket, V), jnp.float32),
                     jax.ShapeDtypeStruct((bucket, V), jnp.bool_), rows)

    def _empty_slots(self, bucket: int) -> Slots:
        V = self.vocab_size
        rows = SamplingRows(*(jnp.zeros((bucket,), a.dtype) for a in sampling_rows([])))
        return Slots(self.model.init_state(bucket), jnp.zeros((bucket, V), jnp.float32),
                     jnp.zeros((bucket, V), jnp.bool_), rows)

    def prefill_pieces(self, T: int) -> list[int]:
        """Piece lengths a T-token prompt runs as: the largest allowed length that fits, repeatedly."""
        pieces = []
        while T:
            piece = next(p for p in self.pieces if p <= T)
            pieces.append(piece)
            T -= piece
        return pieces

    # -- Engine contract -----------------------------------------------------------------
    def compile(self, buckets: Sequence[int]) -> dict[int, float]:
        """Compile step/empty/insert/extract for each bucket and the resize gathers between
        the buckets of this call (a resize between other buckets compiles its gather when it
        first runs: most pairs never do), then run each new executable once on scratch data
        (an executable's first run pays one-off set-up, tens of ms on CPU, which would
        otherwise land on the first step after a bucket switch). Returns {bucket: seconds}."""
        seconds, done = {}, []
        for b in buckets:
            start = time.perf_counter()
            before = set(self.executables.keys())
            for kind in ("step", "empty", "insert", "extract"):
                self._compile(kind, b)
            for other in set(done) - {b}:
                self._compile("gather", (other, b))
                self._compile("gather", (b, other))
            done.append(b)
            new = set(self.executables.keys()) - before
            if new:
                self._warm_up(new)
            seconds[b] = time.perf_counter() - start if new else 0.0
        return seconds

    def _warm_up(self, keys) -> None:
        """Run the slot executables named by keys once on scratch slots."""
        one = self._exe("empty", 1)()
        outputs = []
        for kind, shape in keys:
            exe = self._exe(kind, shape)
            if kind == "step":
                zeros = np.zeros(shape, np.int32)
                outputs.append(exe(self.model.params, self._exe("empty", shape)(), zeros, zeros))
            elif kind == "empty":
                outputs.append(exe())
            elif kind == "insert":
                outputs.append(exe(self._exe("empty", shape)(), np.int32(0), one.state, one.rows, one.banned))
            elif kind == "extract":
                outputs.append(exe(self._exe("empty", shape)().state, np.int32(0)))
            elif kind == "gather":
                outputs.append(exe(self._exe("empty", shape[0])(), np.zeros(shape[1], np.int32)))
        jax.block_until_ready(outputs)

    def compile_prefill(self) -> dict[int, float]:
        """Compile every prefill piece length and the first-token sampling, and run each once
        (its one-off first-run set-up); {length: seconds}."""
        seconds = {}
        for T in self.pieces:
            done = ("prefill", T) in self.executables
            logits, state = self._exe("prefill", T)(self.model.params, np.zeros(T, np.int32),
                                                    self._exe("fresh_row", 1)())
            seconds[T] = 0.0 if done else self.compile_seconds[("prefill", T)]
        self._exe("copy_row", 1)(state)
        self.sample((None, logits), SamplingParams(seed=0))
        return seconds

    def prefill(self, tokens: np.ndarray, start=None):
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim != 1 or tokens.size == 0:
            raise ValueError(f"prefill needs a non-empty 1-D token array, got shape {tokens.shape}")
        state = self._exe("fresh_row", 1)() if start is None else self._exe("copy_row", 1)(start[0])
        offset = 0
        for piece in self.prefill_pieces(tokens.size):
            logits, state = self._exe("prefill", piece)(self.model.params, tokens[offset:offset + piece], state)
            offset += piece
        return jax.block_until_ready((state, logits))  # as prefill_varlen: callers time the call

    def sample(self, row, params: SamplingParams, position: int = 0) -> int:
        return int(self._exe("sample", 1)(row[1], sampling_rows([params]), banned_mask([params], self.vocab_size),
                                          np.array([position], np.int32)))

    def insert(self, slot: int, row, params: SamplingParams) -> None:
        self._check_slot(slot)
        self.slots = self._exe("insert", self.bucket)(self.slots, np.int32(slot), row[0], sampling_rows([params]),
                                                      banned_mask([params], self.vocab_size))

    def extract(self, slot: int):
        self._check_slot(slot)
        return self._exe("extract", self.bucket)(self.slots.state, np.int32(slot)), None

    def resize(self, keep_slots: Sequence[int], new_bucket: int) -> None:
        keep = list(keep_slots)
        if len(keep) > new_bucket or any(not 0 <= s < self.bucket for s in keep):
            raise ValueError(f"cannot keep slots {keep} of bucket {self.bucket} in bucket {new_bucket}")
        if self.slots is None or not keep:  # nothing to keep: a fresh batch (also recovers
            self.slots = self._exe("empty", new_bucket)()  # from a failed step's donated buffers)
        else:
            index = np.array(keep + [0] * (new_bucket - len(keep)), np.int32)
            self.slots = self._exe("gather", (self.bucket, new_bucket))(self.slots, index)
        self.bucket = new_bucket

    def step(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        exe = self._exe("step", self.bucket)
        drawn, _, self.slots = exe(self.model.params, self.slots, np.asarray(tokens, np.int32),
                                   np.asarray(positions, np.int32))
        self.last_path = select_path(self.bucket, 1).name
        return np.asarray(drawn)

    # -- Capability.LOGPROBS ---------------------------------------------------------------
    def step_logprobs(self, tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, TokenLogprobs]:
        exe = self._exe("step_logprobs", self.bucket)
        drawn, scored, self.slots = exe(self.model.params, self.slots, np.asarray(tokens, np.int32),
                                        np.asarray(positions, np.int32))
        self.last_path = select_path(self.bucket, 1).name
        return np.asarray(drawn), TokenLogprobs(*jax.device_get(tuple(scored)))

    def row_logprobs(self, row, token: int) -> TokenLogprobs:
        scored = self._exe("row_logprobs", 1)(row[1][None], np.array([token], np.int32))
        return TokenLogprobs(*jax.device_get(tuple(scored)))

    def prompt_logprobs(self, tokens: np.ndarray) -> TokenLogprobs:
        """Full-output prefill in the pieces ``prefill`` uses (so at most len(prefill_pieces)
        executables); only the scores come back, [T-1] rows."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.ndim != 1 or tokens.size < 2:
            raise ValueError(f"prompt_logprobs needs a 1-D prompt of >= 2 tokens, got shape {tokens.shape}")
        following = np.append(tokens[1:], np.int32(0))  # the last position predicts nothing
        state, parts, offset = self.model.init_state(1), [], 0
        for piece in self.prefill_pieces(tokens.size):
            scored, state = self._exe("score_piece", piece)(
                self.model.params, tokens[offset:offset + piece], following[offset:offset + piece], state)
            parts.append(scored)
            offset += piece
        host = [jax.device_get(tuple(p)) for p in parts]
        return TokenLogprobs(*(np.concatenate(leaf)[:-1] for leaf in zip(*host)))

    def to_host(self, row):
        return tuple(jax.device_get(row[0])) + (None if row[1] is None else np.asarray(row[1]),)

    def from_host(self, host_row):
        """Inverse of ``to_host``; the state leaves are cast to the model's state dtypes (so a
        row whose bfloat16 shifts were widened to float32 loads too)."""
        *state, logits = host_row
        dtypes = (self.model.dtype, jnp.float32, self.model.dtype)
        with self.model.on_device():
            return (State(*(jnp.asarray(a, dt) for a, dt in zip(state, dtypes))),
                    None if logits is None else jnp.asarray(logits))

    # -- Capability.VARLEN_PREFILL and Capability.MIXED_STEP -------------------------------
    def compile_varlen(self, token_rows: int) -> float:
        """Compile (and run once) the flattened prefill of ``token_rows`` tokens."""
        done = ("varlen_prefill", token_rows) in self.executables
        self.prefill_varlen([np.zeros(1, np.int32)], [None], token_rows)
        return 0.0 if done else self.compile_seconds[("varlen_prefill", token_rows)]

    def compile_mixed(self, bucket: int, token_rows: int) -> float:
        """Compile (and run once, on scratch slots) the mixed step of (bucket, token_rows)."""
        key = ("mixed", (bucket, token_rows))
        done = key in self.executables
        zeros = np.zeros(bucket, np.int32)
        pieces = self._pack([np.zeros(1, np.int32)], [None], token_rows)[:4]
        jax.block_until_ready(self._exe("mixed", (bucket, token_rows))(
            self.model.params, self._exe("empty", bucket)(), zeros, zeros, *pieces))
        return 0.0 if done else self.compile_seconds[key]

    def _pack(self, prompts, starts, token_rows: int):
        if self._zero_row is None:
            self._zero_row = self._exe("fresh_row", 1)()
        return pack_pieces(prompts, starts, token_rows, self._zero_row)

    def prefill_varlen(self, prompts: Sequence[np.ndarray], starts: Sequence, token_rows: int) -> list:
        """Prompt pieces (int [T_i] each, 1..MAX_PIECES) in one flattened forward padded to
        ``token_rows`` tokens, piece i continuing from starts[i] (a Row, or None = fresh);
        returns one Row per piece."""
        flat, rows, seg_starts, seg_lengths, n = self._pack(prompts, starts, token_rows)
        out = self._exe("varlen_prefill", token_rows)(self.model.params, flat, rows, seg_starts, seg_lengths)
        # Wait for the result, as a step does: the caller times prefill calls, and cut
        # prompts would otherwise let it queue calls far ahead of the device.
        return list(jax.block_until_ready(out[:n]))

    def mixed_step(self, tokens: np.ndarray, positions: np.ndarray, prompts: Sequence[np.ndarray],
                   starts: Sequence, token_rows: int) -> tuple[np.ndarray, list]:
        """``step`` for every slot plus prompt pieces (padded to ``token_rows`` tokens) in the
        same forward; returns (drawn int32 [bucket], one Row per piece)."""
        flat, rows, seg_starts, seg_lengths, n = self._pack(prompts, starts, token_rows)
        drawn, self.slots, out_rows = self._exe("mixed", (self.bucket, token_rows))(
            self.model.params, self.slots, np.asarray(tokens, np.int32), np.asarray(positions, np.int32),
            flat, rows, seg_starts, seg_lengths)
        self.last_path = Path.DENSE.name
        return np.asarray(drawn), list(out_rows[:n])

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.bucket:
            raise ValueError(f"slot {slot} outside the current bucket of {self.bucket}")
