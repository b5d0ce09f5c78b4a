"""Reduced-precision weights (bfloat16, float16) against float32 on random prompts.

Tolerances, relative to the float32 logits' standard deviation (about 2 here): the unit
roundoff is u = 2^-9 for bfloat16 and 2^-11 for float16. Weights and the residual stream
are rounded at every layer boundary (a dozen roundings per layer, the wkv state and
decay stay float32), so errors of a few u add up to about 1% (bf16) / 0.2% (fp16) of the
logit scale on average; measured means are 0.6-0.7% and 0.09%. We allow 2% / 0.5% mean
and 30% / 10% of the std for the single worst of 32k logits (measured 20% / 2.3%), and
require the argmax to agree on at least 90% of positions (measured 100%).
"""
import logging

import numpy as np
import pytest

import rwkv_jax

LIMITS = {"bfloat16": (0.02, 0.30), "float16": (0.005, 0.10)}  # (mean, max) / logit std


@pytest.fixture(scope="module")
def float32_run(tiny_ckpt):
    """Float32 logits from the torch reference (equal to JAX float32 within 1e-4, see
    test_jax_model.py), which saves a JAX compilation."""
    import rwkv_torch_ref
    ref = rwkv_torch_ref.load(tiny_ckpt)
    tokens = np.random.default_rng(31).integers(0, ref.config.vocab_size, size=(4, 16))
    logits, _ = ref.forward(tokens, ref.init_state(4), full_output=True)
    return tokens, logits.numpy()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reduced_precision_logits_track_float32(tiny_ckpt, float32_run, dtype, record_property):
    tokens, ref = float32_run
    m = rwkv_jax.load(tiny_ckpt, dtype=dtype)
    logits, state = m.forward(tokens, m.init_state(4), full_output=True)
    assert logits.dtype == np.float32 and state.wkv.dtype == np.float32
    assert state.att_shift.dtype == np.dtype(dtype)
    diff = np.abs(np.asarray(logits) - ref)
    scale = ref.std()
    top1 = float((np.asarray(logits).argmax(-1) == ref.argmax(-1)).mean())
    record_property(f"{dtype}_top1_agreement", top1)
    print(f"{dtype}: top-1 agreement {top1:.3f}, mean |diff| {diff.mean() / scale:.4f} std, "
          f"max {diff.max() / scale:.4f} std")
    mean_limit, max_limit = LIMITS[dtype]
    assert diff.mean() <= mean_limit * scale
    assert diff.max() <= max_limit * scale
    assert top1 >= 0.9


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_loading_16_bit_weights_on_the_cpu_says_they_are_slower(tiny_ckpt, dtype, caplog):
    """16-bit weights decode slower than float32 on XLA:CPU: loading them there logs one line
    saying so and what to load instead; float32 logs nothing."""
    with caplog.at_level(logging.WARNING, logger="rwkv_jax.model"):
        rwkv_jax.load(tiny_ckpt, dtype=dtype)
    notes = [r.message for r in caplog.records if r.name == "rwkv_jax.model"]
    if dtype == "float32":
        assert notes == []
    else:
        [note] = notes
        assert note.startswith(f"{dtype} weights on the CPU") and "dtype='float32'" in note
