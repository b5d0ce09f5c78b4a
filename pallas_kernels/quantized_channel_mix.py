"""The channel-mix with quantized weights: relu(xk @ key.T) ** 2 @ value.T, both products by
``quantized_linear`` (dequantized in registers), beside its plain-jnp reference.

key is a ``QuantizedWeight`` [F, C], value one [C, F] (the checkpoint's [out, in] layout, as
every quantized weight is held). The value product skips the q columns of hidden units that are
zero in every row (``quantized_linear``'s ``skip``: masked loads, a unit being one byte per
row in this layout; see that module for what it saves). Skipped columns meet exact zeros, so
``skip=True`` and ``skip=False`` give identical sums.
"""
from __future__ import annotations

import jax.numpy as jnp

from .common import require
from .quantized import QuantizedWeight
from .quantized_linear import quantized_linear, quantized_linear_reference
from .quantized_linear import supports as linear_supports
from .sparse_channel_mix import relu_square


def quantized_channel_mix_reference(xk, w_key: QuantizedWeight, w_val: QuantizedWeight):
    """Plain jnp: xk [M, C] -> [M, C] in xk.dtype (weights dequantized to float32, the square in
    float32 rounded to the model dtype as in ``sparse_channel_mix.channel_mix_reference``)."""
    hidden = relu_square(quantized_linear_reference(xk, w_key, jnp.float32), xk.dtype)
    return quantized_linear_reference(hidden, w_val, xk.dtype)


def supports(M: int, w_key: QuantizedWeight, w_val: QuantizedWeight) -> bool:
    return linear_supports(M, w_key) and linear_supports(M, w_val)


def quantized_channel_mix(xk, w_key: QuantizedWeight, w_val: QuantizedWeight, *, skip: bool = True,
                          interpret: bool = False):
    """Pallas: xk [M, C], key [F, C], value [C, F] (quantized) -> [M, C] in xk.dtype."""
    M, C = xk.shape
    F = w_key.shape[0]
    require(w_key.shape == (F, C) and w_val.shape == (C, F),
            f"quantized_channel_mix: need key [F, C={C}] and value [C, F], got {w_key.shape} and {w_val.shape}")
    require(supports(M, w_key, w_val), f"quantized_channel_mix: unsupported M={M}, F={F}, C={C}")
    pre = quantized_linear(xk, w_key, out_dtype=jnp.float32, interpret=interpret)
    hidden = relu_square(pre, xk.dtype)
    return quantized_linear(hidden, w_val, out_dtype=xk.dtype, skip=skip, interpret=interpret)
