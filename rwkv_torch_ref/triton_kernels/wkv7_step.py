"""Triton kernel: one fused decode step (T = 1) of the time-mix core.

Per (sequence, head) program, in float32: decay from the raw pre-sigmoid value,
kk = L2-normalise(k * k_k), k = k * (1 + (a-1) * k_a), the wkv state update and
read-out, GroupNorm of the head (eps 64e-5) with ln_x, and the bonus term.
The state is read and written in its state dtype (float32, bfloat16 or float16) and updated
in float32. Reference: ``rwkv_torch_ref.wkv.time_mix_core`` with T = 1 (``reference`` below).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rwkv7_core.constants import DECAY_SCALE, GROUP_NORM_EPS, KK_EPS

from ..wkv import CoreParams
from ..wkv import time_mix_core as reference

__all__ = ["wkv7_step_fused", "reference"]


@triton.jit
def _wkv7_step_kernel(r_ptr, w_ptr, k_ptr, v_ptr, a_ptr, kk_w_ptr, ka_ptr, rk_ptr, lnw_ptr,
                      lnb_ptr, s_in_ptr, y_ptr, s_out_ptr, H: tl.constexpr, N: tl.constexpr,
                      DECAY: tl.constexpr, KK_EPS: tl.constexpr, GN_EPS: tl.constexpr):
    pid = tl.program_id(0)            # = b * H + h
    h = pid % H
    n = tl.arange(0, N)
    off = pid * N + n                 # [B, C] rows, head h
    ch = h * N + n                    # per-channel parameters
    r = tl.load(r_ptr + off)
    k = tl.load(k_ptr + off)
    v = tl.load(v_ptr + off)
    a = tl.load(a_ptr + off)
    w = tl.exp(-DECAY * tl.sigmoid(tl.load(w_ptr + off)))
    kk = k * tl.load(kk_w_ptr + ch)
    kk = kk / tl.maximum(tl.sqrt(tl.sum(kk * kk, axis=0)), KK_EPS)
    k = k * (1 + (a - 1) * tl.load(ka_ptr + ch))

    s_off = pid * N * N + n[:, None] * N + n[None, :]
    S = tl.load(s_in_ptr + s_off).to(tl.float32)
    sa = tl.sum(S * (-kk)[None, :], axis=1)
    S = S * w[None, :] + sa[:, None] * (kk * a)[None, :] + v[:, None] * k[None, :]
    tl.store(s_out_ptr + s_off, S.to(s_out_ptr.dtype.element_ty))
    y = tl.sum(S * r[None, :], axis=1)

    mean = tl.sum(y, axis=0) / N
    yc = y - mean
    var = tl.sum(yc * yc, axis=0) / N
    y = yc / tl.sqrt(var + GN_EPS) * tl.load(lnw_ptr + ch) + tl.load(lnb_ptr + ch)
    y = y + tl.sum(r * k * tl.load(rk_ptr + ch), axis=0) * v
    tl.store(y_ptr + off, y)


KERNEL = _wkv7_step_kernel  # for ahead-of-time compiles (rwkv_torch_ref.triton_aot)


def constexprs(H: int, N: int) -> dict:
    """The kernel's compile-time constants for H heads of size N."""
    return dict(H=H, N=N, DECAY=DECAY_SCALE, KK_EPS=KK_EPS, GN_EPS=GROUP_NORM_EPS)


def wkv7_step_fused(r, w_raw, k, v, a, p: CoreParams, S):
    """Fused T=1 time-mix core. r, w_raw, k, v, a float32 [B, 1, C] (or [B, C]);
    p: CoreParams (float32); S [B, H, N, N] float32, bfloat16 or float16. Returns (y [B, 1, C]
    float32, S_new in S's dtype)."""
    B, C = r.shape[0], r.shape[-1]
    H, N = p.r_k.shape
    if r.numel() != B * C:
        raise ValueError(f"the fused step takes T = 1, got r of shape {tuple(r.shape)}")
    if N & (N - 1):
        raise ValueError(f"head size {N} must be a power of two for the Triton kernel")
    ins = [x.to(torch.float32).contiguous() for x in (r, w_raw, k, v, a, *p)]
    y = torch.empty((B, 1, C), dtype=torch.float32, device=r.device)
    s_out = torch.empty((B, H, N, N), dtype=S.dtype, device=r.device)
    _wkv7_step_kernel[(B * H,)](*ins, S.contiguous(), y, s_out, **constexprs(H, N))
    return y, s_out
