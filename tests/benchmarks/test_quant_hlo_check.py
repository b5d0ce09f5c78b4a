"""benchmarks/quant_hlo_check.py: the XLA:CPU decode step of a quantized model keeps no
dequantized copy of a weight, and the check does see one when a program writes it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import quant_hlo_check as check
from pallas_kernels.quantized import QuantizedWeight


def test_quantized_decode_step_keeps_no_dequantized_weight():
    for scheme in ("int8", "fp8"):
        for B in (1, 4):
            assert check.materialised(check.cpu_hlo("tiny", scheme, B)) == [], (scheme, B)


def test_the_check_sees_a_written_copy():
    q = jnp.asarray(np.random.default_rng(0).integers(-127, 128, (64, 128)), jnp.int8)
    scale = jnp.ones((64, 2), jnp.float32)
    hlo = jax.jit(lambda q, s: QuantizedWeight(q, s).dequantize(jnp.float32) + 1).lower(q, scale).compile().as_text()
    assert len(check.materialised(hlo)) == 1
