"""The JaxEngine side of the VARLEN and MIXED prefill policies (scheduler/prefill_policies.py).

- `prefill_varlen(prompts, starts)`: several prompt pieces in one flattened forward
  (`varlen_forward_fn`), each from its own start row; returns one Row per piece.
- `mixed_step(tokens, positions, prompts, starts)`: one decode step for every slot AND the
  prompt pieces in the same forward (decode rows are length-1 sequences ahead of the
  pieces), then on-device sampling of the slots exactly as `JaxEngine.step` does.

Rows are the engine's `(State with B=1, logits float32 [V])`. Shapes compiled: token rows
as given by the caller (the scheduler pads every call to its budget, so the varlen
prefill compiles once and the mixed step once per bucket; default: rounded up by
`varlen_shape`), piece rows always `MAX_PIECES`.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scheduler.prefill_policies import MAX_PIECES, varlen_shape

from .paths import Path
from .sampling import sample_rows, update_counts
from .state import State
from .varlen import segments_from_lengths, varlen_forward_fn


def _stack(rows: Sequence[State]) -> State:
    return State(*(jnp.concatenate(leaves, axis=0) for leaves in zip(*rows)))


def _split(logits, state: State, first: int) -> tuple:
    """Rows first.. of a [P] output as a tuple of (State B=1, logits [V])."""
    return tuple((State(*(leaf[p:p + 1] for leaf in state)), logits[p])
                 for p in range(first, logits.shape[0]))


def _varlen_prefill(params, tokens, rows, starts, lengths, *, config, kernels):
    logits, state = varlen_forward_fn(params, tokens, _stack(rows), starts, lengths,
                                      config=config, kernels=kernels)
    return _split(logits, state, 0)


def _mixed_step(params, slots, tokens, positions, chunk, rows, starts, lengths, *, config, kernels):
    B = tokens.shape[0]
    counts = update_counts(slots.counts, tokens, slots.rows.decay)
    state = State(*(jnp.concatenate(pair, axis=0) for pair in zip(slots.state, _stack(rows))))
    logits, state = varlen_forward_fn(
        params, jnp.concatenate([tokens, chunk]), state,
        jnp.concatenate([jnp.arange(B, dtype=jnp.int32), starts + B]),
        jnp.concatenate([jnp.ones(B, jnp.int32), lengths]),
        config=config, kernels=kernels, n_single=B)
    drawn = sample_rows(logits[:B], counts, slots.rows, slots.banned, positions)
    slots = slots._replace(state=State(*(leaf[:B] for leaf in state)), counts=counts)
    return drawn, slots, _split(logits, state, B)


class VarlenRunner:
    """Compiles and runs the two flattened calls for one `JaxEngine`."""

    def __init__(self, engine):
        self.engine = engine
        static = ("config", "kernels")
        self._jit_prefill = jax.jit(_varlen_prefill, static_argnames=static)
        self._jit_mixed = jax.jit(_mixed_step, static_argnames=static, donate_argnames=("slots",))
        self._zero_row = None

    def _inputs(self, prompts, starts, token_rows=None):
        """(flat tokens int32 [token_rows], start rows, starts, lengths) for the pieces;
        token_rows defaults to varlen_shape of their total."""
        prompts = [np.asarray(p, np.int32).reshape(-1) for p in prompts]
        if not 1 <= len(prompts) <= MAX_PIECES or len(starts) != len(prompts):
            raise ValueError(f"need 1..{MAX_PIECES} prompt pieces with one start row each, got "
                             f"{len(prompts)} pieces and {len(starts)} starts")
        if any(p.size == 0 for p in prompts):
            raise ValueError("every prompt piece needs at least one token")
        lengths = [p.size for p in prompts]
        token_rows = token_rows or varlen_shape(sum(lengths))
        if token_rows < sum(lengths):
            raise ValueError(f"token_rows={token_rows} cannot hold {sum(lengths)} prompt tokens")
        flat = np.zeros(token_rows, np.int32)
        flat[:sum(lengths)] = np.concatenate(prompts)
        if self._zero_row is None:
            self._zero_row = self.engine.model.init_state(1)
        rows = [self._zero_row if s is None else s[0] for s in starts]
        rows += [self._zero_row] * (MAX_PIECES - len(rows))
        segs = segments_from_lengths(lengths, MAX_PIECES)
        return flat, tuple(rows), segs.starts, segs.lengths, len(prompts)

    def _row_structs(self):
        one = jax.eval_shape(lambda: self.engine.model.init_state(1))
        return (jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), one),) * MAX_PIECES

    def _prefill_exe(self, token_rows: int):
        def lower():
            vec = jax.ShapeDtypeStruct((MAX_PIECES,), jnp.int32)
            return self._jit_prefill.lower(self.engine.model.params,
                                           jax.ShapeDtypeStruct((token_rows,), jnp.int32),
                                           self._row_structs(), vec, vec, **self.engine._static)
        return self.engine._executable("varlen_prefill", token_rows, lower)

    def _mixed_exe(self, bucket: int, token_rows: int):
        def lower():
            vec = jax.ShapeDtypeStruct((MAX_PIECES,), jnp.int32)
            slot_vec = jax.ShapeDtypeStruct((bucket,), jnp.int32)
            return self._jit_mixed.lower(self.engine.model.params, self.engine._abstract_slots(bucket),
                                         slot_vec, slot_vec, jax.ShapeDtypeStruct((token_rows,), jnp.int32),
                                         self._row_structs(), vec, vec, **self.engine._static)
        return self.engine._executable("mixed", (bucket, token_rows), lower)

    def compile(self, varlen_token_rows: Sequence[int] = (), mixed: Sequence[tuple[int, int]] = ()) -> None:
        """Compile ahead of time: varlen prefill for each token-row count, the mixed step for
        each (bucket, token_rows). Times land in the engine's ``compile_seconds``."""
        for token_rows in varlen_token_rows:
            self._prefill_exe(token_rows)
        for bucket, token_rows in mixed:
            self._mixed_exe(bucket, token_rows)

    def prefill_varlen(self, prompts: Sequence[np.ndarray], starts: Sequence,
                       token_rows: int | None = None) -> list:
        flat, rows, seg_starts, seg_lengths, n = self._inputs(prompts, starts, token_rows)
        out = self._prefill_exe(flat.size)(self.engine.model.params, flat, rows, seg_starts, seg_lengths)
        # Wait for the result, as a step does: the caller times prefill calls, and cut
        # prompts would otherwise let it queue calls far ahead of the device.
        return list(jax.block_until_ready(out[:n]))

    def mixed_step(self, tokens, positions, prompts: Sequence[np.ndarray], starts: Sequence,
                   token_rows: int | None = None):
        engine = self.engine
        flat, rows, seg_starts, seg_lengths, n = self._inputs(prompts, starts, token_rows)
        drawn, engine.slots, out_rows = self._mixed_exe(engine.bucket, flat.size)(
            engine.model.params, engine.slots, np.asarray(tokens, np.int32), np.asarray(positions, np.int32),
            flat, rows, seg_starts, seg_lengths)
        engine.last_path = Path.DENSE.name
        return np.asarray(drawn), list(out_rows[:n])
