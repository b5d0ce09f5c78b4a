"""The recurrent state: a pytree with a leading batch axis on every leaf (layout and state
dtypes in rwkv7_core.state)."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rwkv7_core.config import ModelConfig
from rwkv7_core.state import check_state_leaves, state_shapes


class State(NamedTuple):
    """att_shift [B, L, C] (model dtype), wkv [B, L, H, N, N] in the state dtype (float32 by
    default; bfloat16 / float16; rows = value dim, cols = key dim), ffn_shift [B, L, C]
    (model dtype). Fresh = zeros."""

    att_shift: jax.Array
    wkv: jax.Array
    ffn_shift: jax.Array


def _dtypes(dtype, state_dtype) -> dict:
    return {"att_shift": np.dtype(dtype), "wkv": np.dtype(state_dtype), "ffn_shift": np.dtype(dtype)}


def init_state(config: ModelConfig, batch_size: int, dtype, state_dtype=jnp.float32) -> State:
    """A fresh (all-zero) state for `batch_size` sequences: shifts in `dtype`, wkv in `state_dtype`."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dtypes = _dtypes(dtype, state_dtype)
    return State(*(jnp.zeros(shape, dtypes[name])
                   for name, shape in state_shapes(config, int(batch_size)).items()))


def check_state(state, config: ModelConfig, batch_size: int, dtype, state_dtype=jnp.float32) -> State:
    """Validate a state for a call with `batch_size` rows; return it as a State of jax arrays.

    Raises ValueError naming the leaf whose type, shape or dtype is wrong.
    """
    leaves = check_state_leaves(state, config, batch_size, _dtypes(dtype, state_dtype))
    return State(*(jnp.asarray(leaf) for leaf in leaves))
