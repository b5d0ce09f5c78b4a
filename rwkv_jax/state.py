"""The recurrent state: a pytree with a leading batch axis on every leaf."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rwkv_torch_ref.config import ModelConfig


class State(NamedTuple):
    """att_shift [B, L, C] (model dtype), wkv [B, L, H, N, N] float32 (rows = value dim,
    cols = key dim), ffn_shift [B, L, C] (model dtype). Fresh = zeros."""

    att_shift: jax.Array
    wkv: jax.Array
    ffn_shift: jax.Array


def init_state(config: ModelConfig, batch_size: int, dtype) -> State:
    """A fresh (all-zero) state for `batch_size` sequences."""
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    B, L, C = int(batch_size), config.n_layer, config.n_embd
    H, N = config.n_head, config.head_size
    return State(jnp.zeros((B, L, C), dtype), jnp.zeros((B, L, H, N, N), jnp.float32),
                 jnp.zeros((B, L, C), dtype))


def check_state(state, config: ModelConfig, batch_size: int, dtype) -> State:
    """Validate a state for a call with `batch_size` rows; return it as a State of jax arrays.

    Raises ValueError naming the leaf whose type, shape or dtype is wrong.
    """
    if not isinstance(state, tuple) or len(state) != 3:
        raise ValueError("state must be a State(att_shift, wkv, ffn_shift) as returned by "
                         f"init_state, got {type(state).__name__}")
    L, C, H, N = config.n_layer, config.n_embd, config.n_head, config.head_size
    want = {"att_shift": ((batch_size, L, C), dtype), "wkv": ((batch_size, L, H, N, N), np.float32),
            "ffn_shift": ((batch_size, L, C), dtype)}
    leaves = []
    for (name, (shape, leaf_dtype)), leaf in zip(want.items(), state):
        got_shape, got_dtype = tuple(getattr(leaf, "shape", ())), getattr(leaf, "dtype", None)
        if got_shape != shape:
            hint = " (batch size differs from the tokens')" if got_shape[1:] == shape[1:] else ""
            raise ValueError(f"state.{name} has shape {got_shape}, expected {shape} "
                             f"[B, L, ...] with leading batch axis{hint}")
        if got_dtype != np.dtype(leaf_dtype):
            raise ValueError(f"state.{name} has dtype {got_dtype}, expected {np.dtype(leaf_dtype)}")
        leaves.append(jnp.asarray(leaf))
    return State(*leaves)
