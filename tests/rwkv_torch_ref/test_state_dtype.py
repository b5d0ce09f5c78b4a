"""The torch reference and its Triton kernels (interpreted on CPU) with the wkv state held in
bfloat16 / float16: the kernels read and write the 16-bit state and update it in float32.

Against the torch ops on the same 16-bit state: float16 rounds to nearest in both, so the
stored states differ only where float32 sums in another order round across a float16 step
(at most one float16 unit in the last place, 2^-10 relative); the Triton interpreter
truncates float32 -> bfloat16 where the GPU rounds (rwkv_torch_ref/triton_kernels), so its
bfloat16 states differ by up to one bfloat16 unit (2^-7 relative) per store. Allowed: one
unit of the dtype relative to the largest state value per store, and logits within 3% (bfloat16)
/ 0.1% (float16) of their std after a prefill and 3 decode steps (measured at most 0.85% and
0.004% over three seeds)."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels' @triton.jit runs

import numpy as np
import pytest
import torch

import rwkv_torch_ref
from rwkv_torch_ref.triton_kernels import runtime_loops_broken, wkv7_seq

needs_runtime_loops = pytest.mark.skipif(runtime_loops_broken() is not None, reason=str(runtime_loops_broken()))
UNIT = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}  # one unit in the last place, relative
LOGITS = {"bfloat16": 3e-2, "float16": 1e-3}  # / logit std


@needs_runtime_loops
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wkv7_seq_reads_and_writes_a_16_bit_state(dtype):
    g = torch.Generator().manual_seed(int(np.random.default_rng().integers(1 << 30)))
    B, T, H, N = 2, 12, 2, 64
    r, k, v = (torch.randn(B, T, H, N, generator=g) for _ in range(3))
    w = torch.exp(-0.606531 * torch.rand(B, T, H, N, generator=g))
    kk = torch.nn.functional.normalize(torch.randn(B, T, H, N, generator=g), dim=-1)
    a = torch.rand(B, T, H, N, generator=g)
    S = (torch.randn(B, H, N, N, generator=g) * 0.3).to(dtype)
    y, S1 = wkv7_seq.wkv7_seq(r, w, k, v, kk, a, S)
    y_ref, S_ref = wkv7_seq.reference(r, w, k, v, kk, a, S)
    assert S1.dtype == S_ref.dtype == dtype
    assert (y - y_ref).abs().max().item() <= 1e-4
    assert (S1.float() - S_ref.float()).abs().max().item() <= UNIT[dtype] * S_ref.float().abs().max().item()


@needs_runtime_loops
@pytest.mark.parametrize("state_dtype", ["bfloat16", "float16"])
def test_model_triton_vs_torch_with_a_16_bit_state(tiny_ckpt, state_dtype):
    ref = rwkv_torch_ref.load(tiny_ckpt, kernels="torch", state_dtype=state_dtype)
    tri = rwkv_torch_ref.load(tiny_ckpt, kernels="triton", state_dtype=state_dtype)
    rng = np.random.default_rng()
    prompt = torch.from_numpy(rng.integers(0, ref.config.vocab_size, (2, 9)))
    l_ref, s_ref = ref.forward(prompt, ref.init_state(2))
    l_tri, s_tri = tri.forward(prompt, tri.init_state(2))
    for _ in range(3):  # decode steps go through the fused T=1 kernel
        step = torch.from_numpy(rng.integers(0, ref.config.vocab_size, (2, 1)))
        l_ref, s_ref = ref.forward(step, s_ref)
        l_tri, s_tri = tri.forward(step, s_tri)
    assert s_tri.wkv.dtype == s_ref.wkv.dtype == getattr(torch, state_dtype)
    assert (l_tri - l_ref).abs().max().item() <= LOGITS[state_dtype] * l_ref.std().item()
    unit = UNIT[s_ref.wkv.dtype] * s_ref.wkv.float().abs().max().item()
    assert (s_tri.wkv.float() - s_ref.wkv.float()).abs().max().item() <= 4 * unit  # one unit per step


def test_a_bad_state_dtype_is_refused(tiny_ckpt):
    with pytest.raises(ValueError, match="state_dtype 'int8' not supported"):
        rwkv_torch_ref.load(tiny_ckpt, state_dtype="int8")
    model = rwkv_torch_ref.load(tiny_ckpt, state_dtype="float16")
    with pytest.raises(ValueError, match="state.wkv has dtype torch.float32, expected torch.float16"):
        model.forward(np.zeros((1, 1), np.int64), rwkv_torch_ref.load(tiny_ckpt).init_state(1))
