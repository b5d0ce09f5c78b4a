"""Seeded random weights in the official checkpoint layout, with well-scaled activations.

``init_spec`` is the one definition of the distributions: projections are N(0, 1/fan_in)
so hidden states stay O(1); the residual writes (att.output, ffn.value) are shrunk by
1/sqrt(2L); decays spread over the whole allowed range; the head gives logits with a
standard deviation of about 2. ``random_tensors`` draws them with numpy; the JAX model
draws the same specs on its device (``rwkv_jax.random_params``).
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import numpy as np

from .checkpoint import SUPPORTED_DTYPES, Tensors, write_checkpoint
from .config import ModelConfig, expected_shapes


class InitSpec(NamedTuple):
    """A distribution: ``normal`` (a = mean, b = std) or ``uniform`` (a = low, b = high)."""
    kind: str
    a: float
    b: float


def init_spec(key: str, shape: tuple[int, ...], n_layer: int) -> InitSpec:
    """The distribution of checkpoint tensor ``key`` (of ``shape``) in a model of n_layer layers."""
    suffix = key.split(".", 2)[-1] if key.startswith("blocks.") else key
    fan_in = shape[-1]
    if suffix.endswith(("ln0.weight", "ln1.weight", "ln2.weight", "ln_x.weight")) or key == "ln_out.weight":
        return InitSpec("normal", 1.0, 0.1)
    if suffix.endswith(".bias"):
        return InitSpec("normal", 0.0, 0.05)
    if suffix.startswith(("att.x_", "ffn.x_")):
        return InitSpec("uniform", 0.0, 1.0)
    if suffix == "att.w0":
        return InitSpec("uniform", -4.0, 2.0)
    if suffix in ("att.a0", "att.v0"):
        return InitSpec("normal", 0.0, 0.5)
    if suffix in ("att.w1", "att.a1", "att.v1", "att.g1", "att.g2"):  # stored [in, out]
        return InitSpec("normal", 0.0, 1.0 / math.sqrt(shape[0]))
    if suffix in ("att.w2", "att.a2", "att.v2"):
        return InitSpec("normal", 0.0, 0.5 / math.sqrt(shape[0]))
    if suffix == "att.k_k":
        return InitSpec("uniform", 0.5, 1.0)
    if suffix == "att.k_a":
        return InitSpec("uniform", 0.5, 1.5)
    if suffix == "att.r_k":
        return InitSpec("normal", 0.0, 0.3)
    if suffix in ("att.output.weight", "ffn.value.weight"):
        return InitSpec("normal", 0.0, 1.0 / math.sqrt(2 * n_layer) / math.sqrt(fan_in))
    if key == "emb.weight":
        return InitSpec("normal", 0.0, 1.0)
    if key == "head.weight":
        return InitSpec("normal", 0.0, 2.0 / math.sqrt(fan_in))
    return InitSpec("normal", 0.0, 1.0 / math.sqrt(fan_in))  # r/k/v and ffn.key projections


def random_tensors(config: ModelConfig, seed: int = 0, dtype: str = "float32") -> Tensors:
    """Every tensor of a checkpoint of ``config``, drawn by ``init_spec`` with numpy (seeded)."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {dtype!r} not in {sorted(SUPPORTED_DTYPES)}")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for key, shape in expected_shapes(config).items():
        spec = init_spec(key, shape, config.n_layer)
        if spec.kind == "uniform":
            t = rng.uniform(spec.a, spec.b, size=shape).astype(np.float32)
        else:
            t = rng.standard_normal(shape, dtype=np.float32) * np.float32(spec.b) + np.float32(spec.a)
        out[key] = t.astype(SUPPORTED_DTYPES[dtype])
    return out


def write_random_checkpoint(path: str | os.PathLike, config: ModelConfig, seed: int = 0,
                            dtype: str = "float32") -> ModelConfig:
    """Write a seeded random checkpoint (see ``random_tensors``); returns its config."""
    write_checkpoint(path, random_tensors(config, seed, dtype))
    return config
