"""Triton kernels (run by the Triton interpreter on CPU) against their torch references:
the [B, T] wkv recurrence and the fused T=1 step, <= 2e-5 on output and state over 64
steps; and the whole model with kernels="triton" against kernels="torch", <= 1e-4."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' @triton.jit runs

import numpy as np
import pytest
import torch

import rwkv_torch_ref
from rwkv_torch_ref.triton_kernels import runtime_loops_broken, wkv7_seq, wkv7_step
from rwkv_torch_ref.wkv import CoreParams

needs_runtime_loops = pytest.mark.skipif(runtime_loops_broken() is not None, reason=str(runtime_loops_broken()))

B, H, N, STEPS = 2, 2, 64, 64
TOL = 2e-5


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _seq_inputs(T, seed):
    """Random recurrence inputs in their real ranges: w in [0.545, 1), kk unit per head."""
    g = _gen(seed)
    def rnd(*shape):
        return torch.randn(*shape, generator=g)
    w = torch.exp(-0.606531 * torch.rand(B, T, H, N, generator=g))
    kk = torch.nn.functional.normalize(rnd(B, T, H, N), dim=-1)
    a = torch.rand(B, T, H, N, generator=g)
    S = rnd(B, H, N, N) * 0.3
    return rnd(B, T, H, N), w, rnd(B, T, H, N), rnd(B, T, H, N), kk, a, S


@needs_runtime_loops
def test_wkv7_seq_matches_reference():
    inputs = _seq_inputs(STEPS, seed=0)
    S_before = inputs[-1].clone()
    y, S = wkv7_seq.wkv7_seq(*inputs)
    y_ref, S_ref = wkv7_seq.reference(*(x.double() for x in inputs))
    assert torch.equal(inputs[-1], S_before)
    assert y_ref.abs().max() > 1 and S_ref.abs().max() > 1
    dy, ds = (y.double() - y_ref).abs().max().item(), (S.double() - S_ref).abs().max().item()
    print(f"wkv7_seq triton vs float64 reference, {STEPS} steps: y {dy:.3g}, state {ds:.3g}")
    assert dy <= TOL and ds <= TOL


@needs_runtime_loops
def test_wkv7_seq_chunks_carry_state():
    r, w, k, v, kk, a, S = _seq_inputs(12, seed=1)
    y_all, S_all = wkv7_seq.wkv7_seq(r, w, k, v, kk, a, S)
    y1, S1 = wkv7_seq.wkv7_seq(*(x[:, :5] for x in (r, w, k, v, kk, a)), S)
    y2, S2 = wkv7_seq.wkv7_seq(*(x[:, 5:] for x in (r, w, k, v, kk, a)), S1)
    assert (torch.cat([y1, y2], 1) - y_all).abs().max().item() <= TOL
    assert (S2 - S_all).abs().max().item() <= TOL


def _core_params(seed):
    g = _gen(seed)
    C = H * N
    return CoreParams(k_k=torch.rand(C, generator=g) + 0.5, k_a=torch.rand(C, generator=g) + 0.5,
                      r_k=torch.randn(H, N, generator=g) * 0.3,
                      ln_w=1 + 0.1 * torch.randn(C, generator=g), ln_b=0.05 * torch.randn(C, generator=g))


def test_fused_step_matches_reference_over_64_steps():
    p = _core_params(seed=2)
    g = _gen(3)
    S = S_ref = torch.zeros(1, H, N, N)
    worst_y = worst_s = 0.0
    for _ in range(STEPS):
        r, w_raw, k, v = (torch.randn(1, 1, H * N, generator=g) for _ in range(4))
        a = torch.rand(1, 1, H * N, generator=g)
        y, S = wkv7_step.wkv7_step_fused(r, w_raw, k, v, a, p, S)
        y_ref, S_ref = wkv7_step.reference(r, w_raw, k, v, a, p, S_ref)
        worst_y = max(worst_y, (y - y_ref).abs().max().item())
        worst_s = max(worst_s, (S - S_ref).abs().max().item())
    print(f"fused step triton vs torch, {STEPS} steps: y {worst_y:.3g}, state {worst_s:.3g}")
    assert S_ref.abs().max() > 1
    assert worst_y <= TOL and worst_s <= TOL, (worst_y, worst_s)


def test_kernels_reject_non_power_of_two_head():
    r = torch.zeros(1, 2, 1, 48)
    with pytest.raises(ValueError, match="power of two"):
        wkv7_seq.wkv7_seq(r, r, r, r, r, r, torch.zeros(1, 1, 48, 48))


@pytest.mark.parametrize("fixture, batch, prompt_len", [("tiny_ckpt", 2, 9), ("odd_ckpt", 1, 6)])
@needs_runtime_loops
def test_model_triton_vs_torch(request, fixture, batch, prompt_len):
    path = request.getfixturevalue(fixture)
    ref = rwkv_torch_ref.load(path, dtype="float32", kernels="torch")
    tri = rwkv_torch_ref.load(path, dtype="float32", kernels="triton")
    rng = np.random.default_rng(4)
    prompt = torch.from_numpy(rng.integers(0, ref.config.vocab_size, (batch, prompt_len)))
    l_ref, s_ref = ref.forward(prompt, ref.init_state(batch), full_output=True)
    l_tri, s_tri = tri.forward(prompt, tri.init_state(batch), full_output=True)
    worst = (l_tri - l_ref).abs().max().item()
    for _ in range(3):  # decode steps go through the fused T=1 kernel
        step = torch.from_numpy(rng.integers(0, ref.config.vocab_size, (batch, 1)))
        l_ref, s_ref = ref.forward(step, s_ref)
        l_tri, s_tri = tri.forward(step, s_tri)
        worst = max(worst, (l_tri - l_ref).abs().max().item())
    ds = max((a - b).abs().max().item() for a, b in zip(s_tri, s_ref))
    print(f"model triton vs torch ({fixture}): logits {worst:.3g}, state {ds:.3g}")
    assert worst <= 1e-4, worst
    assert max((a - b).abs().max().item() for a, b in zip(s_tri, s_ref)) <= 1e-4
