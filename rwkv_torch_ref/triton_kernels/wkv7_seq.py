"""Triton kernel: the wkv7 recurrence over [B, T] with the state in and out.

One program per (sequence, head) keeps its [N, N] state in registers (float32) and
walks the T steps; the state comes in and goes out in its state dtype (float32, bfloat16
or float16), rounded once at the end. Reference: ``rwkv_torch_ref.wkv.wkv7_seq`` (imported below as
``reference``); the two must agree to float32 rounding.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..wkv import wkv7_seq as reference

__all__ = ["wkv7_seq", "reference"]


@triton.jit
def _wkv7_seq_kernel(r_ptr, w_ptr, k_ptr, v_ptr, kk_ptr, a_ptr, s_in_ptr, y_ptr, s_out_ptr,
                     T, H: tl.constexpr, N: tl.constexpr):
    pid = tl.program_id(0)            # = b * H + h
    b = pid // H
    h = pid % H
    i = tl.arange(0, N)               # value index (state rows)
    j = tl.arange(0, N)               # key index (state cols)
    s_off = pid * N * N + i[:, None] * N + j[None, :]
    S = tl.load(s_in_ptr + s_off).to(tl.float32)
    for t in range(T):
        off = ((b * T + t) * H + h) * N + j
        r = tl.load(r_ptr + off)
        w = tl.load(w_ptr + off)
        k = tl.load(k_ptr + off)
        kk = tl.load(kk_ptr + off)
        a = tl.load(a_ptr + off)
        v = tl.load(v_ptr + ((b * T + t) * H + h) * N + i)
        sa = tl.sum(S * (-kk)[None, :], axis=1)
        S = S * w[None, :] + sa[:, None] * (kk * a)[None, :] + v[:, None] * k[None, :]
        y = tl.sum(S * r[None, :], axis=1)
        tl.store(y_ptr + ((b * T + t) * H + h) * N + i, y)
    tl.store(s_out_ptr + s_off, S.to(s_out_ptr.dtype.element_ty))


INTERPRETED = all(type(f).__name__ == "InterpretedFunction" for f in (_wkv7_seq_kernel, tl.sum))
"""Whether the kernels, and Triton's own library they call (``tl.sum``: built when triton was
first imported), were built for the Triton interpreter (TRITON_INTERPRET=1 at both imports)."""
KERNEL = _wkv7_seq_kernel  # for ahead-of-time compiles (rwkv_torch_ref.triton_aot)


def constexprs(H: int, N: int) -> dict:
    """The kernel's compile-time constants for H heads of size N."""
    return dict(H=H, N=N)


def wkv7_seq(r, w, k, v, kk, a, S):
    """Same contract as the reference: r, w, k, v, kk, a float32 [B, T, H, N];
    S [B, H, N, N] float32, bfloat16 or float16. Returns (y [B, T, H, N] float32, S_new in S's
    dtype); the input S is untouched."""
    B, T, H, N = r.shape
    if S.shape != (B, H, N, N):
        raise ValueError(f"S has shape {tuple(S.shape)}, expected {(B, H, N, N)}")
    if N & (N - 1):
        raise ValueError(f"head size {N} must be a power of two for the Triton kernel")
    ins = [x.to(torch.float32).contiguous() for x in (r, w, k, v, kk, a)]
    y = torch.empty((B, T, H, N), dtype=torch.float32, device=r.device)
    s_out = torch.empty((B, H, N, N), dtype=S.dtype, device=r.device)
    _wkv7_seq_kernel[(B * H,)](*ins, S.contiguous(), y, s_out, T, **constexprs(H, N))
    return y, s_out
