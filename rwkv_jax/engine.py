"""`JaxEngine`: the engine contract (rwkv7_core/engine.py) on a `rwkv_jax.Model`.

Device-resident batch ("slots", donated through every step): the recurrent State [bucket, ...],
penalty counts float32 [bucket, V], banned-token mask bool [bucket, V] and per-slot sampling
parameters (SamplingRows of [bucket] arrays). One decode step is one jitted call: count the
fed tokens, run ``forward_fn`` (T=1, kernel path ``select_path(bucket, 1)``) and sample every
row on device; only the drawn int32 [bucket] tokens come back to the host.

Every executable is compiled ahead of time and kept in the engine's one ``executables``
cache, keyed (kind, shape); each kind is one entry of ``rwkv_jax.executables.EXECUTABLES``.
Per bucket the step, the empty batch, the slot insert and the slot extract; a fresh and a
copied B=1 row (the starts of prefill); per pair of buckets the gather used by ``resize``
(compiled with the buckets when they are compiled together, as ``--precompile`` does, else
by the first resize between them); per prompt piece length the prefill: a prompt of T
tokens runs as pieces of the allowed lengths ``prefill_pieces`` (default 1, 2, 4, ..., 256),
largest first, so any T needs at most len(prefill_pieces) prefill executables; per flat
size the varlen prefill and per (bucket, flat size) the mixed step
(Capability.VARLEN_PREFILL, MIXED_STEP); for Capability.LOGPROBS (by compile_logprobs, else on first use): per
bucket the step that also scores the drawn tokens, the first-token scoring, and per piece
length the full-output prompt scoring (the plain step stays as lean as before); for
Capability.TOKEN_MASK, compiled on first use: the "_masked" twins of the scoring step, the
first-token draw and the mixed step, which also take packed allowed-token masks, and the
masked decode step as two calls, its forward and its masked sampling, so that a mask function
(rwkv7_core/token_mask.Masks) runs on the host while the dispatched forward computes (only
batches holding a grammar-constrained row run them).
"""
from __future__ import annotations

import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rwkv7_core.engine import Capability, Slots
from rwkv7_core.engine_checks import check_prompt, check_resize, check_slot
from rwkv7_core.sampling import SamplingParams, TokenLogprobs, banned_mask, sampling_rows
from rwkv7_core.state import check_wkv_dtype
from rwkv7_core.token_mask import Masks, masks_now

from .compilation import ExecutableCache, compiler_options, platform_of
from .executables import lower, warm_up_args
from .paths import Path, select_path
from .state import State
from .varlen_engine import pack_pieces

PREFILL_PIECES = tuple(1 << i for i in range(9))
"""The default prefill piece lengths: 256, 128, ... 1 tokens (each compiled once)."""


class JaxEngine:
    """Engine contract (with every ``Capability``: varlen prefill, mixed step, logprobs,
    compile reports, token masks, and compiles: its ``compile*`` may run on a second thread
    beside the steps, ``ExecutableCache`` being thread-safe) for a loaded ``rwkv_jax.Model``.

    Rows (``prefill``/``extract`` results) are ``(State with B=1, logits float32 [V] | None)``;
    host rows are the numpy copies of the same leaves. ``executables`` is the one cache of
    compiled executables, keyed (kind, shape) (the kinds: ``rwkv_jax.executables.EXECUTABLES``);
    ``lower(key)`` gives a key's jax.stages.Lowered. The contract's ``config``, ``dtype``, ``kernels``
    and ``device`` are the model's, and so is ``state_dtype`` (the wkv state's dtype name).
    """

    capabilities = frozenset(Capability)

    def __init__(self, model, prefill_pieces: Sequence[int] = PREFILL_PIECES):
        if 1 not in prefill_pieces:
            raise ValueError(f"prefill_pieces={tuple(prefill_pieces)} must include 1")
        self.model = model
        self.config, self.vocab_size = model.config, model.config.vocab_size
        self.dtype, self.kernels = jnp.dtype(model.dtype).name, model.kernels.value
        self.state_dtype = jnp.dtype(model.state_dtype).name
        self.device = None if model.device is None else str(model.device)
        self.prefill_pieces = tuple(sorted(set(int(p) for p in prefill_pieces), reverse=True))
        self.bucket = 0
        self.last_path = ""
        self.slots: Slots | None = None
        self.executables = ExecutableCache(self.lower, compiler_options(platform_of(model.params)))
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
        """The jax.stages.Lowered executable for key = (kind, shape), placed on the model's device."""
        with self.model.on_device():
            return lower(self.model, key)

    def _run(self, kind: str, shape, *args):
        """Run the executable of (kind, shape) on args; its first run counts as compiling."""
        return self.executables.call((kind, shape), *args)

    def _compile_and_run(self, keys) -> set:
        """Compile each key not compiled yet and run it once on scratch arguments (its one-off
        first-run set-up); returns those keys."""
        new = {key for key in keys if key not in self.executables}
        with self.model.on_device():
            jax.block_until_ready([self.executables.call(key, *warm_up_args(self.model, key)) for key in new])
        return new

    def piece_lengths(self, T: int) -> list[int]:
        """Piece lengths a T-token prompt runs as: the largest allowed length that fits, repeatedly."""
        pieces = []
        while T:
            piece = next(p for p in self.prefill_pieces if p <= T)
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
        seconds: dict[int, float] = {}
        done: list[int] = []
        for b in buckets:
            start = time.perf_counter()
            keys: list[tuple] = [(kind, b) for kind in ("empty", "step", "insert", "extract")]
            keys += [("gather", pair) for other in set(done) - {b} for pair in ((other, b), (b, other))]
            done.append(b)
            seconds[b] = time.perf_counter() - start if self._compile_and_run(keys) else 0.0
        return seconds

    def compile_prefill(self) -> dict[int, float]:
        """Compile every prefill piece length, the fresh and copied rows and the first-token
        sampling, and run each once (its one-off first-run set-up); {length: seconds}."""
        new = self._compile_and_run([("fresh_row", 1), ("copy_row", 1), ("sample", 1)]
                                    + [("prefill", T) for T in self.prefill_pieces])
        return {T: self.compile_seconds[("prefill", T)] if ("prefill", T) in new else 0.0 for T in self.prefill_pieces}

    def prefill(self, tokens: np.ndarray, start=None):
        tokens = check_prompt(tokens, "prefill").astype(np.int32)
        state = self._run("fresh_row", 1) if start is None else self._run("copy_row", 1, start[0])
        offset = 0
        for piece in self.piece_lengths(tokens.size):
            logits, state = self._run("prefill", piece, self.model.params, tokens[offset:offset + piece], state)
            offset += piece
        return jax.block_until_ready((state, logits))  # as prefill_varlen: callers time the call

    def sample(self, row, params: SamplingParams, position: int = 0, allowed: Masks = None) -> int:
        args = (row[1], sampling_rows([params]), banned_mask([params], self.vocab_size), np.array([position], np.int32))
        allowed = masks_now(allowed)
        if allowed is None:
            return int(self._run("sample", 1, *args))
        return int(self._run("sample_masked", 1, *args, np.asarray(allowed, np.int32).reshape(1, -1)))

    def insert(self, slot: int, row, params: SamplingParams) -> None:
        check_slot(slot, self.bucket)
        self.slots = self._run("insert", self.bucket, self.slots, np.int32(slot), row[0], sampling_rows([params]),
                               banned_mask([params], self.vocab_size))

    def extract(self, slot: int):
        check_slot(slot, self.bucket)
        return self._run("extract", self.bucket, self.slots.state, np.int32(slot)), None

    def resize(self, keep_slots: Sequence[int], new_bucket: int) -> None:
        keep = check_resize(keep_slots, self.bucket, new_bucket)
        if self.slots is None or not keep:  # nothing to keep: a fresh batch (also recovers
            self.slots = self._run("empty", new_bucket)  # from a failed step's donated buffers)
        else:
            index = np.array(keep + [0] * (new_bucket - len(keep)), np.int32)
            self.slots = self._run("gather", (self.bucket, new_bucket), self.slots, index)
        self.bucket = new_bucket

    def _decode_args(self, tokens, positions, allowed: Masks) -> tuple:
        """The step's arguments after the slots (the packed masks last, when given)."""
        args = (np.asarray(tokens, np.int32), np.asarray(positions, np.int32))
        allowed = masks_now(allowed)
        return args if allowed is None else (*args, np.asarray(allowed, np.int32))

    def step(self, tokens: np.ndarray, positions: np.ndarray, allowed: Masks = None) -> np.ndarray:
        self.last_path = select_path(self.bucket, 1).name
        if allowed is None:
            drawn, _, self.slots = self._run("step", self.bucket, self.model.params, self.slots,
                                             *self._decode_args(tokens, positions, None))
            return np.asarray(drawn)
        # masked: the forward is dispatched (asynchronously) before the masks are asked for
        logits, self.slots = self._run("step_forward", self.bucket, self.model.params, self.slots,
                                       np.asarray(tokens, np.int32))
        drawn = self._run("step_sample_masked", self.bucket, logits, self.slots, np.asarray(positions, np.int32),
                          np.asarray(masks_now(allowed), np.int32))
        return np.asarray(drawn)

    # -- Capability.LOGPROBS ---------------------------------------------------------------
    def compile_logprobs(self, buckets: Sequence[int]) -> dict[str, float]:
        """Compile (and run once) the scoring step of each bucket, the first-token scoring and
        the prompt scoring of every piece length; {"kind:shape": seconds}."""
        keys = ([("step_logprobs", b) for b in buckets] + [("row_logprobs", 1), ("fresh_row", 1)]
                + [("score_piece", T) for T in self.prefill_pieces])
        new = self._compile_and_run(keys)
        return {f"{kind}:{shape}": self.compile_seconds[(kind, shape)] if (kind, shape) in new else 0.0
                for kind, shape in keys}

    def step_logprobs(self, tokens: np.ndarray, positions: np.ndarray,
                      allowed: Masks = None) -> tuple[np.ndarray, TokenLogprobs]:
        kind = "step_logprobs" if allowed is None else "step_logprobs_masked"
        drawn, scored, self.slots = self._run(kind, self.bucket, self.model.params, self.slots,
                                              *self._decode_args(tokens, positions, allowed))
        self.last_path = select_path(self.bucket, 1).name
        return np.asarray(drawn), TokenLogprobs(*jax.device_get(tuple(scored)))

    def row_logprobs(self, row, token: int) -> TokenLogprobs:
        scored = self._run("row_logprobs", 1, row[1], np.array([token], np.int32))
        return TokenLogprobs(*jax.device_get(tuple(scored)))

    def prompt_logprobs(self, tokens: np.ndarray) -> TokenLogprobs:
        """Full-output prefill in the pieces ``prefill`` uses (so at most len(prefill_pieces)
        executables); only the scores come back, [T-1] rows."""
        tokens = check_prompt(tokens, "prompt_logprobs", min_tokens=2).astype(np.int32)
        following = np.append(tokens[1:], np.int32(0))  # the last position predicts nothing
        state, parts, offset = self._run("fresh_row", 1), [], 0
        for piece in self.piece_lengths(tokens.size):
            scored, state = self._run(
                "score_piece", piece, self.model.params, tokens[offset:offset + piece], following[offset:offset + piece], state)
            parts.append(scored)
            offset += piece
        host = [jax.device_get(tuple(p)) for p in parts]
        return TokenLogprobs(*(np.concatenate(leaf)[:-1] for leaf in zip(*host)))

    def to_host(self, row):
        return tuple(jax.device_get(row[0])) + (None if row[1] is None else np.asarray(row[1]),)

    def from_host(self, host_row):
        """Inverse of ``to_host``; the shifts are cast to the model's dtype (so a row whose
        bfloat16 shifts were widened to float32 loads too); a wkv leaf in another state dtype
        is refused (``StateDtypeError``)."""
        *state, logits = host_row
        check_wkv_dtype(np.asarray(state[1]).dtype, self.state_dtype, "host row")
        dtypes = (self.model.dtype, self.model.state_dtype, self.model.dtype)
        with self.model.on_device():  # cast on the host: device_put compiles nothing (jnp.asarray would)
            return (State(*(jax.device_put(np.asarray(a, dt)) for a, dt in zip(state, dtypes))),
                    None if logits is None else jax.device_put(np.asarray(logits, np.float32)))

    # -- Capability.VARLEN_PREFILL and Capability.MIXED_STEP -------------------------------
    def compile_varlen(self, token_rows: int) -> float:
        """Compile (and run once) the flattened prefill of ``token_rows`` tokens."""
        key = ("varlen_prefill", token_rows)
        return self.compile_seconds[key] if key in self._compile_and_run([("fresh_row", 1), key]) else 0.0

    def compile_mixed(self, bucket: int, token_rows: int) -> float:
        """Compile (and run once, on scratch slots) the mixed step of (bucket, token_rows)."""
        key = ("mixed", (bucket, token_rows))
        return self.compile_seconds[key] if key in self._compile_and_run([("fresh_row", 1), key]) else 0.0

    def _pack(self, prompts, starts, token_rows: int):
        if self._zero_row is None:
            self._zero_row = self._run("fresh_row", 1)
        return pack_pieces(prompts, starts, token_rows, self._zero_row)

    def prefill_varlen(self, prompts: Sequence[np.ndarray], starts: Sequence, token_rows: int) -> list:
        """Prompt pieces (int [T_i] each, 1..MAX_PIECES) in one flattened forward padded to
        ``token_rows`` tokens, piece i continuing from starts[i] (a Row, or None = fresh);
        returns one Row per piece."""
        flat, rows, seg_starts, seg_lengths, n = self._pack(prompts, starts, token_rows)
        out = self._run("varlen_prefill", token_rows, self.model.params, flat, rows, seg_starts, seg_lengths)
        # Wait for the result, as a step does: the caller times prefill calls, and cut
        # prompts would otherwise let it queue calls far ahead of the device.
        return list(jax.block_until_ready(out[:n]))

    def mixed_step(self, tokens: np.ndarray, positions: np.ndarray, prompts: Sequence[np.ndarray],
                   starts: Sequence, token_rows: int, allowed: Masks = None) -> tuple[np.ndarray, list]:
        """``step`` for every slot plus prompt pieces (padded to ``token_rows`` tokens) in the
        same forward; returns (drawn int32 [bucket], one Row per piece)."""
        flat, rows, seg_starts, seg_lengths, n = self._pack(prompts, starts, token_rows)
        allowed = masks_now(allowed)
        masks = () if allowed is None else (np.asarray(allowed, np.int32),)
        drawn, self.slots, out_rows = self._run(
            "mixed" if allowed is None else "mixed_masked", (self.bucket, token_rows), self.model.params, self.slots,
            np.asarray(tokens, np.int32), np.asarray(positions, np.int32), flat, rows, seg_starts, seg_lengths, *masks)
        self.last_path = Path.DENSE.name
        return np.asarray(drawn), list(out_rows[:n])
