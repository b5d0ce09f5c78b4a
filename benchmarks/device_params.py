"""Random RWKV-7 weights generated directly on the device, in the JAX model's params layout.

A 2.9b-shape model is ~6 GB in bf16; building it on the host and copying it over is slow,
so every leaf is drawn with jax.random on the default device. Distributions follow
`rwkv_torch_ref.checkpoint.random_tensors` (well-scaled activations, decays over the whole
range), mapped onto the layout of `rwkv_jax.modules.RWKV7` (matrices [out, in], low-rank
matrices transposed, per-channel vectors stacked in rows).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from rwkv_jax.modules import RWKV7
from rwkv_torch_ref.config import ModelConfig

# Row layouts of the stacked per-channel leaves (see rwkv_jax.modules):
# ln [4, C] = ln0/ln1 weight, bias, ln_out/ln2 weight, bias; vecs [7, C] = w0 a0 v0 k_k k_a lnx_w lnx_b.
_LN_ROWS = ("weight", "bias", "weight", "bias")
_VEC_ROWS = (("uniform", -4.0, 2.0), ("normal", 0.0, 0.5), ("normal", 0.0, 0.5), ("uniform", 0.5, 1.0),
             ("uniform", 0.5, 1.5), ("normal", 1.0, 0.1), ("normal", 0.0, 0.05))


def params_struct(config: ModelConfig, dtype) -> dict:
    """The params pytree of an RWKV7 of this config as ShapeDtypeStructs (nothing allocated)."""
    return jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(RWKV7(config, None, dtype))[1]))


def _row(key, kind: str, a: float, b: float, width: int):
    if kind == "uniform":
        return jax.random.uniform(key, (width,), minval=a, maxval=b)
    return a + b * jax.random.normal(key, (width,))


@functools.partial(jax.jit, static_argnames=("name", "shape", "dtype", "n_layer"))
def _leaf(key, *, name: str, shape: tuple, dtype, n_layer: int):
    """One leaf drawn by its name in the params dict (see module docstring)."""
    if name == "ln":
        rows = [_row(k, "normal", 1.0, 0.1, shape[1]) if r == "weight" else _row(k, "normal", 0.0, 0.05, shape[1])
                for k, r in zip(jax.random.split(key, 4), _LN_ROWS)]
        return jnp.stack(rows).astype(dtype)
    if name == "vecs":
        return jnp.stack([_row(k, *spec, shape[1])
                          for k, spec in zip(jax.random.split(key, 7), _VEC_ROWS)]).astype(dtype)
    if name == "mix":
        return jax.random.uniform(key, shape).astype(dtype)
    std = {"r_k": 0.3, "emb": 1.0, "head": 2.0 / math.sqrt(shape[-1]),
           "w2": 0.5 / math.sqrt(shape[-1]), "a2": 0.5 / math.sqrt(shape[-1]),
           "v2": 0.5 / math.sqrt(shape[-1])}.get(name, 1.0 / math.sqrt(shape[-1]))
    if name == "value_ffn":  # held [F, C]: fan-in is the first axis
        std = 1.0 / math.sqrt(shape[0])
    if name in ("output", "value_ffn"):
        std /= math.sqrt(2 * n_layer)
    return (std * jax.random.normal(key, shape)).astype(dtype)


def random_params(config: ModelConfig, dtype=jnp.bfloat16, seed: int = 0) -> dict:
    """A random params dict for `config` on the default device (same layout as rwkv_jax.load)."""
    struct = params_struct(config, dtype)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(struct)
    key = jax.random.key(seed)
    out = []
    for i, (path, leaf) in enumerate(leaves):
        names = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        name = "value_ffn" if names[-2:] == ["ffn", "value"] else names[-1]
        out.append(_leaf(jax.random.fold_in(key, i), name=name, shape=tuple(leaf.shape),
                         dtype=leaf.dtype, n_layer=config.n_layer))
    return jax.tree_util.tree_unflatten(treedef, out)
