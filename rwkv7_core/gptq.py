"""GPTQ: int8 / int4 weights whose rounding errors are compensated by the columns not yet
rounded, weighted by the inputs a calibration text gives the projection (numpy only).

For a projection ``y = x @ w.T`` (w [out, in]) and the mean Gram matrix of its inputs over a
calibration text, H = mean(x^T x) [in, in] (``rwkv_torch_ref.calibration.input_gram``), GPTQ
minimises the output error sum over rows of (w - w_q) H (w - w_q)^T by rounding one input
channel (column) at a time, left to right, and moving each column's rounding error onto the
columns to its right through the upper Cholesky factor U of H^-1 (H^-1 = U^T U):
``w[:, j+1:] -= ((w[:, j] - w_q[:, j]) / U[j, j]) outer U[j, j+1:]``.

The stored layout is ``rwkv7_core.quantization``'s (q and one float32 scale per output row and
group of G input channels, int4 packed two a byte), so a GPTQ checkpoint loads and runs as any
int8 / int4 checkpoint. A group's scales are max|w| / qmax over the group's columns as they
stand when the sweep reaches the group (after the earlier groups' error moved onto them).
Columns are taken in their stored order (no activation ordering: it would interleave the
groups' scales). H is damped by ``DAMP`` x its mean diagonal; an input channel that never
carries a value (diagonal 0) has its weights rounded to 0 at no cost.
"""
from __future__ import annotations

import numpy as np

from .quantization import GROUPED, QMAX, QuantizationError, QuantSpec, check_width, pack_int4

DAMP = 0.01  # the Gram matrix's damping, a fraction of its mean diagonal


def inverse_factor(gram: np.ndarray, damp: float = DAMP) -> tuple[np.ndarray, np.ndarray]:
    """gram float [in, in] (symmetric, positive semi-definite) -> (U float64 [in, in] upper
    triangular with (H + damping)^-1 = U^T U, dead bool [in]: the channels with a zero
    diagonal, given a unit diagonal before damping)."""
    h = np.array(gram, np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    h[np.diag_indices_from(h)] += damp * np.mean(np.diag(h))
    lower = np.linalg.cholesky(h)
    inverse = np.linalg.inv(lower)
    h_inv = inverse.T @ inverse
    return np.linalg.cholesky(h_inv).T, dead


def quantize_gptq(w: np.ndarray, spec: QuantSpec, gram: np.ndarray, key: str = "weight",
                  damp: float = DAMP) -> tuple[np.ndarray, np.ndarray]:
    """w [out, in] (any float dtype), gram float [in, in] of the projection's inputs ->
    (q int8 [out, in], or uint8 [out, in / 2] packed for int4; scale float32 [out, in / G]), as
    ``rwkv7_core.quantization.quantize`` returns them. QuantizationError naming `key` for a
    scheme without groups or a Gram matrix of the wrong shape."""
    check_width(spec, key, w.shape)
    out, width = w.shape
    if spec.scheme not in GROUPED:
        raise QuantizationError(f"key {key!r}: GPTQ needs int8 or int4, not {spec.scheme}")
    if np.shape(gram) != (width, width):
        raise QuantizationError(f"key {key!r}: GPTQ needs a Gram matrix of shape ({width}, {width}), "
                                f"got {np.shape(gram)}")
    g, qmax = spec.group(width), QMAX[spec.scheme]
    u, dead = inverse_factor(gram, damp)
    u = u.astype(np.float32)
    rest = np.array(w, np.float32)
    rest[:, dead] = 0.0
    q = np.empty((out, width), np.int8)
    scale = np.empty((out, width // g), np.float32)
    for n, start in enumerate(range(0, width, g)):
        end = start + g
        block = rest[:, start:end].copy()
        absmax = np.abs(block).max(axis=1)
        s = np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)
        errors = np.empty_like(block)
        for j in range(g):
            col = np.clip(np.rint(block[:, j] / s), -qmax, qmax)
            q[:, start + j] = col
            errors[:, j] = (block[:, j] - col * s) / u[start + j, start + j]
            block[:, j + 1:] -= np.outer(errors[:, j], u[start + j, start + j + 1:end])
        rest[:, end:] -= errors @ u[start:end, end:]
        scale[:, n] = s
    return (pack_int4(q, g) if spec.scheme == "int4" else q), scale
