"""A tuned-state file (random ``blocks.{i}.att.time_state``) loaded with
``rwkv7_core.state_files.load_state`` into our engines gives the logits of BlinkDL's ``rwkv``
package (RWKV_V7_ON=1, 'cpu fp32') started from the same time_state, within 1e-4.

The official x070 model takes a state list of 3L tensors [att_shift (C), wkv (H, N, N),
ffn_shift (C)] per layer; its wkv update is ``S = S * w[None, :] + S @ ab + v[:, None] k[None, :]``,
so rows are the value dim, as in ours and in the tuned file: time_state[i] goes into slot
3i + 1 as it is, with zero shifts. Injecting the transpose instead changes the logits far
beyond the tolerance, so the check pins the orientation.
"""
from __future__ import annotations

import os

os.environ["RWKV_V7_ON"] = "1"  # read when rwkv.model is imported

import numpy as np
import pytest
import torch

import rwkv_torch_ref
from rwkv7_core import write_checkpoint
from rwkv7_core.checkpoint import read_checkpoint
from rwkv7_core.state_files import load_state, to_host_row
from rwkv_torch_ref.engine import TorchEngine

TOL = 1e-4


def _official_logits(official, time_state, tokens, transpose=False):
    state = official.generate_zero_state()
    for i, ts in enumerate(time_state):
        t = torch.from_numpy(np.ascontiguousarray(ts.transpose(0, 2, 1) if transpose else ts))
        state[i * 3 + 1] = t.clone()
    seq, state = official.forward(tokens[:-1], state, full_output=True)
    last, _ = official.forward(tokens[-1:], state)  # the one-token path, from the carried state
    return torch.cat([seq.reshape(len(tokens) - 1, -1), last.reshape(1, -1)]).double()


def _jax_logits(path, state, tokens):
    import rwkv_jax
    from rwkv_jax.engine import JaxEngine

    engine = JaxEngine(rwkv_jax.load(path, dtype="float32"))
    start = engine.from_host(to_host_row(state))[0]
    logits, _ = engine.model.forward(np.asarray([tokens], np.int32), start, full_output=True)
    return torch.from_numpy(np.array(logits[0])).double()


@pytest.mark.parametrize("ckpt, ext", [("tiny_ckpt", "pth"), ("odd_ckpt", "safetensors")])
def test_tuned_state_matches_the_official_package(request, tmp_path, ckpt, ext):
    from rwkv.model import RWKV

    path = request.getfixturevalue(ckpt)
    config = read_checkpoint(path.with_suffix(".safetensors"))[1]
    rng = np.random.default_rng()
    shape = (config.n_head, config.head_size, config.head_size)
    time_state = [(rng.standard_normal(shape) * 0.5).astype(np.float32) for _ in range(config.n_layer)]
    tuned = tmp_path / f"tuned.{ext}"
    write_checkpoint(tuned, {f"blocks.{i}.att.time_state": ts for i, ts in enumerate(time_state)})
    tokens = rng.integers(0, config.vocab_size, 24).tolist()

    state = load_state(tuned, config)
    official = RWKV(model=str(path.with_suffix("")), strategy="cpu fp32")
    ref = _official_logits(official, time_state, tokens)
    engine = TorchEngine(rwkv_torch_ref.load(path, dtype="float32"))
    ours, _ = engine.model.forward(torch.tensor([tokens]), engine.from_host(to_host_row(state))[0],
                                   full_output=True)
    torch_diff = (ours[0].double() - ref).abs().max().item()
    jax_diff = (_jax_logits(path, state, tokens) - ref).abs().max().item()
    transposed_diff = (_official_logits(official, time_state, tokens, transpose=True) - ref).abs().max().item()
    zero_diff = (_official_logits(official, [np.zeros(shape, np.float32)] * config.n_layer, tokens) - ref).abs().max().item()
    print(f"torch {torch_diff:.3g}, jax {jax_diff:.3g}; transposed state {transposed_diff:.3g}, zero state {zero_diff:.3g}")
    assert torch_diff <= TOL and jax_diff <= TOL
    assert transposed_diff > 100 * TOL and zero_diff > 100 * TOL  # the comparison sees the state's orientation
