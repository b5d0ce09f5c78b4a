"""The time-mix core of RWKV-7 in plain torch: decay and key preparation, the wkv
recurrence, and the read-out (GroupNorm + bonus). These are the references the Triton
kernels in ``triton_kernels/`` are tested against, and the ``kernels="torch"`` path.

Shapes: B batch, T time, H heads, N head size, C = H*N. Everything here runs in the
accumulation dtype (float32, or float64 for a float64 model); the state S comes in and goes
out in its state dtype (rwkv7_core.state: possibly bfloat16 / float16), carried in the
accumulation dtype through the T steps and rounded once at the end.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from rwkv7_core.constants import DECAY_SCALE, GROUP_NORM_EPS, KK_EPS


class CoreParams(NamedTuple):
    """One layer's per-channel time-mix parameters, accumulation dtype, each [C] (r_k [H, N])."""
    k_k: torch.Tensor
    k_a: torch.Tensor
    r_k: torch.Tensor
    ln_w: torch.Tensor
    ln_b: torch.Tensor


def prepare(k: torch.Tensor, w_raw: torch.Tensor, a: torch.Tensor, p: CoreParams):
    """Decay multiplier, adjusted key and normalised kk from [B, T, C] inputs.

    Returns (w, k, kk), each [B, T, H, N]: w = exp(-0.606531*sigmoid(w_raw)),
    kk = L2-normalise(k*k_k) per head, k = k*(1 + (a-1)*k_a).
    """
    B, T, _ = k.shape
    H, N = p.r_k.shape
    w = torch.exp(-DECAY_SCALE * torch.sigmoid(w_raw))
    kk = F.normalize((k * p.k_k).view(B, T, H, N), dim=-1, eps=KK_EPS)
    k = k * (1 + (a - 1) * p.k_a)
    return w.view(B, T, H, N), k.view(B, T, H, N), kk


def wkv7_seq(r, w, k, v, kk, a, S):
    """The wkv recurrence over T steps.

    r, w, k, v, kk, a: [B, T, H, N]; S: [B, H, N, N] (rows = value i, cols = key j) in a
    state dtype. Per step: S = S*w[None,:] + (S @ -kk)[:,None] * (kk*a)[None,:] + v[:,None]*k[None,:];
    y = S @ r. Returns (y [B, T, H, N], S_new [B, H, N, N] in S's dtype).
    """
    dtype, S = S.dtype, S.to(r.dtype)
    ys = []
    for t in range(r.shape[1]):
        sa = torch.einsum("bhij,bhj->bhi", S, -kk[:, t])
        S = (S * w[:, t, :, None, :] + sa[..., None] * (kk[:, t] * a[:, t])[:, :, None, :]
             + v[:, t, :, :, None] * k[:, t, :, None, :])
        ys.append(torch.einsum("bhij,bhj->bhi", S, r[:, t]))
    return torch.stack(ys, dim=1), S.to(dtype)


def read_out(y, r, k, v, p: CoreParams) -> torch.Tensor:
    """GroupNorm(H groups) * ln_x + bonus; y, r, k, v [B, T, H, N] -> [B, T, C]."""
    B, T, H, N = y.shape
    out = F.group_norm(y.reshape(B * T, H * N), H, p.ln_w, p.ln_b, eps=GROUP_NORM_EPS)
    bonus = (r * k * p.r_k).sum(-1, keepdim=True) * v
    return out.view(B, T, H * N) + bonus.reshape(B, T, H * N)


def time_mix_core(r, w_raw, k, v, a, p: CoreParams, S, wkv_seq=wkv7_seq):
    """prepare -> wkv recurrence -> read_out.

    r, w_raw, k, v, a: [B, T, C] (accumulation dtype; w_raw is the pre-sigmoid decay,
    k the raw key, a the in-context rate after its sigmoid); S [B, H, N, N].
    Returns (y [B, T, C], S_new).
    """
    B, T, C = r.shape
    H, N = p.r_k.shape
    w, k, kk = prepare(k, w_raw, a, p)
    r, v, a = (x.view(B, T, H, N) for x in (r, v, a))
    y, S = wkv_seq(r, w, k, v, kk, a, S)
    return read_out(y, r, k, v, p), S
