"""Random RWKV-7 models drawn directly on the device, with rwkv7_core's distributions.

A 2.9b-shape model is ~6 GB in bf16; drawing it with numpy and copying it over is slow,
so every checkpoint tensor is drawn by ``rwkv7_core.random_weights.init_spec`` with
jax.random on the default device, then laid out exactly as ``rwkv_jax.load`` lays out a
checkpoint.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from rwkv7_core.config import ModelConfig, expected_shapes
from rwkv7_core.quantization import QuantSpec
from rwkv7_core.random_weights import init_spec
from rwkv7_core.random_weights import random_tensors as host_random_tensors

from .kernels import Kernels
from .model import DTYPES, Model
from .modules import RWKV7


def params_struct(config: ModelConfig, dtype, quant: QuantSpec | None = None) -> dict:
    """The params pytree of an RWKV7 of this config (weights quantized by `quant`, see
    rwkv7_core.quantization) as ShapeDtypeStructs (nothing allocated)."""
    return jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(RWKV7(config, None, dtype, quant))[1]))


@functools.partial(jax.jit, static_argnames=("shape", "kind", "a", "b"))
def _draw(key, *, shape: tuple, kind: str, a: float, b: float):
    if kind == "uniform":
        return jax.random.uniform(key, shape, minval=a, maxval=b)
    return a + b * jax.random.normal(key, shape)


def random_tensors(config: ModelConfig, seed: int = 0) -> dict:
    """Checkpoint-layout float32 tensors of ``config`` drawn on the default device."""
    key = jax.random.key(seed)
    return {name: _draw(jax.random.fold_in(key, i), shape=shape, **init_spec(name, shape, config.n_layer)._asdict())
            for i, (name, shape) in enumerate(expected_shapes(config).items())}


def random_params(config: ModelConfig, dtype=jnp.bfloat16, seed: int = 0, host: bool = False) -> dict:
    """The params dict (as ``rwkv_jax.load`` makes it) of a random model, on the default device.
    host=True draws with numpy instead (``rwkv7_core.random_weights.random_tensors``: the
    weights of ``write_random_checkpoint(path, config, seed)``, with no compile per tensor
    shape, so the quicker choice for small shapes)."""
    tensors = host_random_tensors(config, seed) if host else random_tensors(config, seed)
    return nnx.to_pure_dict(nnx.split(RWKV7(config, tensors, dtype))[1])


def random_model(config: ModelConfig, dtype: str = "bfloat16", kernels: str | Kernels = "xla",
                 seed: int = 0) -> Model:
    """A random Model of ``config`` built on the default device."""
    return Model(random_params(config, DTYPES[dtype], seed), config, DTYPES[dtype], kernels)
