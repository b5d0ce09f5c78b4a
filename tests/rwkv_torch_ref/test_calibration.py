"""rwkv_torch_ref.calibration: the per-channel input power of every quantized projection."""
import numpy as np
import torch

import rwkv_torch_ref
from rwkv7_core.checkpoint import read_checkpoint
from rwkv7_core.quantization import quantized_key
from rwkv_torch_ref.calibration import input_power


def test_input_power_is_each_projections_mean_square_input(tiny_ckpt):
    model = rwkv_torch_ref.load(tiny_ckpt)
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, 300)  # two chunks
    power = input_power(model, tokens)
    tensors, config = read_checkpoint(tiny_ckpt)
    assert set(power) == {k for k in tensors if quantized_key(k)}
    for key, p in power.items():
        assert p.shape == (tensors.shape(key)[1],) and (p >= 0).all() and p.max() > 0, key
    # the head's input rows, recovered from a plain run's logits (logits = x @ head.T)
    state, rows = model.init_state(1), []
    with torch.no_grad():
        for start in range(0, 300, 256):
            logits, state = model.forward(tokens[None, start:start + 256], state, full_output=True)
            rows.append(logits[0])
    logits = torch.cat(rows).double()
    head = model.head.double()
    x = torch.linalg.lstsq(head, logits.T).solution.T  # the LN_out rows that gave these logits
    np.testing.assert_allclose(power["head.weight"], (x ** 2).mean(0).numpy(), rtol=1e-3)
