"""Kernel-path selection by batch shape: which specialised code a (B, T) call runs.

Thresholds (rows = B * T):
- ``T > 1``                      -> ``DENSE``: prefill/sequence form; full matrix products over
  all B*T rows plus a sequential wkv scan over T.
- ``T == 1`` and ``B == 1``      -> ``B1T1``: single-sequence decode; every product is a
  matrix-vector product (memory-bound: reading the weights dominates).
- ``T == 1`` and ``1 < B <= MAX_DECODE_BATCH`` -> ``BATCHED_DECODE``: small-M products,
  per-(sequence, head) wkv steps.
- ``T == 1`` and ``B > MAX_DECODE_BATCH`` -> ``DENSE``: with that many rows the products are
  ordinary dense GEMMs, so small-M decode kernels no longer pay off.
"""
from __future__ import annotations

import enum

MAX_DECODE_BATCH = 256


class Path(enum.Enum):
    """The specialised implementation a forward call runs (chosen at trace time)."""

    B1T1 = "b1t1"
    BATCHED_DECODE = "batched_decode"
    DENSE = "dense"


def select_path(B: int, T: int) -> Path:
    """Return the kernel path for a call with B sequences of T tokens each (see module doc)."""
    if B < 1 or T < 1:
        raise ValueError(f"select_path needs B >= 1 and T >= 1, got B={B}, T={T}")
    if T > 1 or B > MAX_DECODE_BATCH:
        return Path.DENSE
    return Path.B1T1 if B == 1 else Path.BATCHED_DECODE
