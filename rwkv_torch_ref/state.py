"""The recurrent state of the torch reference: one NamedTuple with a leading batch axis.

Layout (identical in the JAX model)::

    att_shift  [B, L, C]        model dtype  previous token's LN1 output, per layer
    wkv        [B, L, H, N, N]  state dtype  float32 by default (float64 for a float64 model),
                                             or bfloat16 / float16 (rwkv7_core.state);
                                             rows = value dim i, cols = key dim j
    ffn_shift  [B, L, C]        model dtype  previous token's LN2 output, per layer

A fresh sequence is all zeros. Row b of every leaf belongs to sequence b, so the
scheduler moves sequences with ``select_rows`` / ``concat_states`` / ``replace_rows``.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from rwkv7_core.config import ModelConfig
from rwkv7_core.state import check_state_leaves, state_shapes


class State(NamedTuple):
    att_shift: torch.Tensor
    wkv: torch.Tensor
    ffn_shift: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.att_shift.shape[0]


def wkv_dtype(dtype: torch.dtype) -> torch.dtype:
    """The wkv state's dtype for a model of ``dtype``: float64 stays, all else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def zeros_state(config: ModelConfig, batch_size: int, dtype: torch.dtype,
                device: torch.device | str = "cpu", state_dtype: torch.dtype | None = None) -> State:
    """A fresh (all-zero) state for ``batch_size`` sequences (wkv in ``state_dtype``, None:
    ``wkv_dtype(dtype)``)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dtypes = leaf_dtypes(dtype, state_dtype)
    return State(*(torch.zeros(shape, dtype=dtypes[name], device=device)
                   for name, shape in state_shapes(config, batch_size).items()))


def leaf_dtypes(dtype: torch.dtype, state_dtype: torch.dtype | None = None) -> dict:
    """{leaf name: torch dtype} of the state of a ``dtype`` model holding its wkv state in
    ``state_dtype`` (None: ``wkv_dtype(dtype)``)."""
    return {"att_shift": dtype, "wkv": state_dtype or wkv_dtype(dtype), "ffn_shift": dtype}


def select_rows(state: State, rows: Sequence[int] | torch.Tensor) -> State:
    """Gather sequences ``rows`` (indices into the batch axis) into a new state."""
    idx = torch.as_tensor(rows, dtype=torch.long, device=state.wkv.device)
    return State(*(leaf.index_select(0, idx) for leaf in state))


def concat_states(states: Sequence[State]) -> State:
    """Stack states of the same model along the batch axis (in the given order)."""
    if not states:
        raise ValueError("concat_states needs at least one state")
    return State(*(torch.cat(leaves, dim=0) for leaves in zip(*states)))


def replace_rows(state: State, rows: Sequence[int] | torch.Tensor, new: State) -> State:
    """A copy of ``state`` whose batch rows ``rows`` are the rows of ``new`` (in order)."""
    idx = torch.as_tensor(rows, dtype=torch.long, device=state.wkv.device)
    if new.batch_size != idx.numel():
        raise ValueError(f"replace_rows: {idx.numel()} row indices but the new state has "
                         f"batch size {new.batch_size}")
    return State(*(leaf.index_copy(0, idx, part.to(leaf.dtype))
                   for leaf, part in zip(state, new)))


def check_state(state: object, config: ModelConfig, batch_size: int, dtype: torch.dtype,
                state_dtype: torch.dtype | None = None) -> State:
    """Validate a state against the model and a token batch; ValueError names the problem."""
    leaves = check_state_leaves(state, config, batch_size, leaf_dtypes(dtype, state_dtype))
    for name, leaf in zip(State._fields, leaves):
        if not isinstance(leaf, torch.Tensor):
            raise ValueError(f"state.{name} must be a torch.Tensor, got {type(leaf).__name__}")
    return State(*leaves)
