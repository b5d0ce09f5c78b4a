"""rwkv_torch_ref.calibration: the per-channel input power and the input Gram matrix of every quantized projection."""
import numpy as np
import torch

import rwkv_torch_ref
from rwkv7_core.checkpoint import read_checkpoint
from rwkv7_core.quantization import quantized_key
from rwkv_torch_ref.calibration import input_gram, input_power


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


def test_input_gram_is_the_mean_outer_product_and_its_diagonal_the_power(tiny_ckpt):
    model = rwkv_torch_ref.load(tiny_ckpt)
    tokens = np.random.default_rng(1).integers(0, model.config.vocab_size, 270)
    keys = ["head.weight", "blocks.1.ffn.value.weight"]
    gram = input_gram(model, tokens, keys)
    power = input_power(model, tokens)
    assert set(gram) == set(keys)
    for key, g in gram.items():
        assert g.shape == (power[key].size,) * 2
        np.testing.assert_allclose(g, g.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.diag(g), power[key], rtol=1e-9)
        assert np.linalg.eigvalsh(g).min() > -1e-9 * np.abs(g).max(), key  # positive semi-definite
    # the head's input rows, recovered from the logits as above: their mean outer product
    state, rows = model.init_state(1), []
    with torch.no_grad():
        for start in range(0, 270, 256):
            logits, state = model.forward(tokens[None, start:start + 256], state, full_output=True)
            rows.append(logits[0])
    x = torch.linalg.lstsq(model.head.double(), torch.cat(rows).double().T).solution.T.numpy()
    np.testing.assert_allclose(gram["head.weight"], x.T @ x / len(x), rtol=1e-3, atol=1e-6 * np.abs(x).max() ** 2)
