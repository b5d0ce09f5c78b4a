"""benchmarks/quant_hlo_check.py: the XLA:CPU decode step of a quantized model keeps no
dequantized copy of a weight and recomputes no product's input row, and the check does see
either when a program has it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import quant_hlo_check as check
from pallas_kernels.quantized import QuantizedWeight, quantized_matmul_f32


def test_quantized_decode_step_keeps_no_dequantized_weight():
    for scheme in ("int8", "fp8"):
        for B in (1, 4):
            hlo = check.cpu_hlo("tiny", scheme, B)
            assert check.materialised(hlo) == [], (scheme, B)
            assert check.recomputed_inputs(hlo) == [], (scheme, B)


def test_the_check_sees_a_written_copy():
    q = jnp.asarray(np.random.default_rng(0).integers(-127, 128, (64, 128)), jnp.int8)
    scale = jnp.ones((64, 2), jnp.float32)
    hlo = jax.jit(lambda q, s: QuantizedWeight(q, s).dequantize(jnp.float32) + 1).lower(q, scale).compile().as_text()
    assert len(check.materialised(hlo)) == 1


def test_the_check_sees_a_recomputed_input_row():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.integers(-127, 128, (64, 128)), jnp.int8)
    scale, x = jnp.ones((64, 2), jnp.float32), jnp.asarray(rng.standard_normal((1, 128)), jnp.float32)

    def product(x, q, s, once):
        x = jnp.tanh(x) * 2 + 1  # cheap producers after an expensive one, as a LayerNorm's
        w = QuantizedWeight(q, s)
        return quantized_matmul_f32(x, w) if once else x @ w.dequantize(jnp.float32).T

    for once, count in ((False, 1), (True, 0)):
        hlo = jax.jit(product, static_argnums=3).lower(x, q, scale, once).compile().as_text()
        assert len(check.recomputed_inputs(hlo)) == count, once
