"""The recurrent state's layout, and the input checks both backends share (numpy only).

Per sequence and layer: ``att_shift`` [C] (the previous token's LN1 output), ``wkv``
[H, N, N] (rows = value dim i, cols = key dim j), ``ffn_shift`` [C] (the previous
token's LN2 output). Batched, every leaf gets a leading batch axis and a layer axis:
att_shift [B, L, C], wkv [B, L, H, N, N], ffn_shift [B, L, C]. A fresh sequence is zeros.

The shifts are held in the model's activation dtype (they are LayerNorm outputs already
rounded to it, so that is exact). The wkv leaf is held in the **state dtype**
(``STATE_DTYPES``; float32 by default, bfloat16 or float16 to halve the bytes a decode step
reads and writes and every stored state): inside a call the recurrence always runs in
float32 (or the torch reference's float64), the state is rounded to the state dtype only
where a call stores it (after every token of a decode step, at the end of a prefill call).
"""
from __future__ import annotations

import numpy as np

from .config import ModelConfig

STATE_LEAVES = ("att_shift", "wkv", "ffn_shift")
STATE_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_STATE_DTYPE = "float32"


class StateDtypeError(ValueError):
    """A stored state (a host row, a state file, a cache entry) whose wkv leaf is not in the
    model's state dtype: states are never converted silently between state dtypes."""


def check_wkv_dtype(wkv_dtype, state_dtype: str, source: str = "state") -> None:
    """StateDtypeError naming ``source`` unless a wkv leaf's dtype (numpy, or its name) is
    ``state_dtype``."""
    got = np.dtype(wkv_dtype).name
    if got != state_dtype:
        raise StateDtypeError(f"{source}: its wkv state is {got} but this model holds its state in {state_dtype} "
                              f"(load the model with state_dtype={got!r} / --state-dtype {got})")


def check_state_dtype(state_dtype: str) -> str:
    """``state_dtype`` if it is one of ``STATE_DTYPES``, else a ValueError naming the choices."""
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype {state_dtype!r} not supported; choose one of {list(STATE_DTYPES)}")
    return state_dtype


def state_shapes(config: ModelConfig, batch_size: int) -> dict[str, tuple[int, ...]]:
    """{leaf name: shape} of a batch of ``batch_size`` states."""
    c = config
    shift = (batch_size, c.n_layer, c.n_embd)
    return {"att_shift": shift, "wkv": (batch_size, c.n_layer, c.n_head, c.head_size, c.head_size),
            "ffn_shift": shift}


def check_state_leaves(state: object, config: ModelConfig, batch_size: int, dtypes: dict) -> tuple:
    """Validate a (att_shift, wkv, ffn_shift) tuple of arrays for ``batch_size`` rows.

    dtypes: {leaf name: expected dtype} (compared with ``==``, so numpy, jax or torch dtypes
    all work). Returns the three leaves; ValueError names the leaf whose shape or dtype is wrong.
    """
    if not isinstance(state, tuple) or len(state) != 3:
        raise ValueError("state must be a State(att_shift, wkv, ffn_shift) as made by "
                         f"init_state, got {type(state).__name__}")
    for name, shape, leaf in zip(STATE_LEAVES, state_shapes(config, batch_size).values(), state):
        got = tuple(getattr(leaf, "shape", ()))
        if got != shape and got[1:] == shape[1:]:
            raise ValueError(f"state.{name} has shape {got}: batch size {got[0]} but the tokens have "
                             f"batch size {batch_size} (the batch size differs)")
        if got != shape:
            raise ValueError(f"state.{name} has shape {got}, expected {shape} "
                             "([B, L, C] / [B, L, H, N, N], leading batch axis)")
        if getattr(leaf, "dtype", None) != dtypes[name]:
            raise ValueError(f"state.{name} has dtype {getattr(leaf, 'dtype', None)}, "
                             f"expected {dtypes[name]}")
    return tuple(state)


def check_tokens(tokens, vocab_size: int) -> np.ndarray:
    """tokens as an int64 [B, T] numpy array with every id in [0, vocab_size); ValueError
    names the problem (ragged, not integers, wrong rank, empty, id out of range)."""
    try:
        arr = np.asarray(tokens)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"tokens must be a rectangular [B, T] array of ints: {e}") from None
    if arr.ndim != 2:
        raise ValueError(f"tokens must have shape [B, T], got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"tokens is empty (shape {arr.shape}); need B >= 1 and T >= 1")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"tokens must be integers (token ids), got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary: "
                         f"token ids must lie in [0, {vocab_size})")
    return arr.astype(np.int64)
