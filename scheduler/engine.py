"""The engine protocol: what the scheduler needs from a model, in numpy types.

The engine owns the device-resident batched state of the current bucket: ``bucket`` slots,
each holding one sequence's recurrent state plus its sampling state (parameters, penalty
counts, banned-token mask). The scheduler decides which request sits in which slot; the
engine never sees request ids. Two kinds of handle cross the boundary:

- ``Row``: one sequence's state after some tokens, opaque and device-resident (the engine's
  own type), plus the float32 logits [V] of its last position when it came from prefill.
- ``HostRow``: the same as a tuple of numpy arrays (for the host-side prefix cache); its
  size is ``host_row_bytes(row)``.

Token draws are a pure function of (logits, penalty counts, params, seed, position), so a
request's tokens do not depend on its slot, its neighbours or the bucket (see sampling.py).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from .params import SamplingParams

NONFINITE_TOKEN = -1
"""Returned in place of a token for a row whose logits held NaN or inf."""

Row = Any
HostRow = tuple


@runtime_checkable
class Engine(Protocol):
    vocab_size: int
    bucket: int          # current number of slots; 0 before the first resize
    last_path: str       # kernel-path name of the last step (e.g. "B1T1", "BATCHED_DECODE")

    def compile(self, buckets: Sequence[int]) -> dict[int, float]:
        """Compile the decode step (and slot ops) for each bucket ahead of time;
        returns {bucket: seconds}. Already-compiled buckets cost ~0 and report 0.0."""

    def prefill(self, tokens: np.ndarray, start: Row | None = None) -> Row:
        """Run tokens (int [T], T >= 1) from ``start`` (None = fresh zeros) as one sequence
        (B=1, T). Returns the row after the last token, holding its logits. Thread-safe with
        respect to step/insert/resize (it touches no slot); the scheduler calls it serially."""

    def sample(self, row: Row, params: SamplingParams, position: int = 0) -> int:
        """Draw a token from a prefilled row's logits with fresh (zero) penalty counts, exactly
        as ``step`` would for that row at ``position``; NONFINITE_TOKEN if the logits are not
        finite. ``params.seed`` must be an int."""

    def insert(self, slot: int, row: Row, params: SamplingParams) -> None:
        """Put a row's state in ``slot`` (< bucket), set the slot's sampling parameters and
        clear its penalty counts. ``params.seed`` must be an int."""

    def extract(self, slot: int) -> Row:
        """A copy of the state in ``slot`` (no logits)."""

    def resize(self, keep_slots: Sequence[int], new_bucket: int) -> None:
        """Make the batch ``new_bucket`` slots: slot keep_slots[i] moves to slot i (with its
        sampling state); other slots hold unspecified data. len(keep_slots) <= new_bucket.
        With no slots to keep the engine builds a fresh batch: the scheduler relies on this
        after a failed step (whose state may be lost, e.g. donated buffers)."""

    def step(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One decode step for all slots. tokens: int32 [bucket], each slot's last token
        (fed to the model; also counted for penalties); positions: int32 [bucket], the index
        of the token being drawn within the request's output (the seed's draw counter).
        Returns int32 [bucket]: the drawn tokens, NONFINITE_TOKEN for rows whose logits were
        not finite. Only the drawn tokens are fetched to the host."""

    def to_host(self, row: Row) -> HostRow:
        """Copy a row (state and logits, if any) to numpy arrays."""

    def from_host(self, host_row: HostRow) -> Row:
        """Inverse of ``to_host``."""


def host_row_bytes(host_row: HostRow) -> int:
    """Bytes held by a host row."""
    return int(sum(np.asarray(a).nbytes for a in host_row if a is not None))
