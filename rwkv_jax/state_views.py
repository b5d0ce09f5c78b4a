"""How the layer loop hands each layer its piece of the recurrent state.

``SlicedState`` (every path but the fused decode): layer i gets ``leaf[:, i]`` of each leaf and
its new rows are written back into the (donated) leaves layer by layer: each layer's slice is
read before it is overwritten, so XLA updates the buffer in place (stacking the new layers
instead made XLA:GPU copy the whole wkv state first: 100 MB per step at 1.5b, B=8, measured
deviceless). ``InPlaceState`` (the fused decode kernels):
layer i gets ``LayerSlice(leaf, i)``, the whole [B, L, ...] leaf and the layer its kernels read
and write in place (their outputs alias their inputs), so no slice of the state is ever
materialised; each layer's updated leaves are what the next layer reads. ``RowsState`` (prefill
rows on the Pallas kernels): the same whole leaves in, the wkv leaf updated in place by the
chunked kernel, each layer's new shift rows [B, C] kept and stacked once at the end (one launch
per shift leaf for the whole model instead of a slice copy and an update per layer).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LayerSlice(NamedTuple):
    """A whole state leaf [B, L, ...] and the layer a kernel updates in place."""

    full: jax.Array
    layer: int

    def rows(self) -> jax.Array:
        """The layer's rows [B, ...] (a slice: for the reference ops)."""
        return self.full[:, self.layer]

    def replace(self, rows: jax.Array) -> "LayerSlice":
        """This leaf with the layer's rows replaced."""
        return LayerSlice(self.full.at[:, self.layer].set(rows.astype(self.full.dtype)), self.layer)


class SlicedState:
    """Per-layer slices in, written back in place (see module doc)."""

    def __init__(self, state):
        self.state = tuple(state)

    def layer(self, i: int) -> tuple:
        return tuple(leaf[:, i] for leaf in self.state)

    def set(self, i: int, layer_state: tuple) -> None:
        self.state = tuple(jax.lax.dynamic_update_index_in_dim(leaf, new.astype(leaf.dtype), i, 1)
                           for leaf, new in zip(self.state, layer_state))

    def result(self) -> tuple:
        return self.state


class InPlaceState:
    """Whole leaves with a layer index in, the last layer's leaves out (see module doc)."""

    def __init__(self, state):
        self.state = tuple(state)

    def layer(self, i: int) -> tuple:
        return tuple(LayerSlice(leaf, i) for leaf in self.state)

    def set(self, i: int, layer_state: tuple) -> None:
        self.state = tuple(x.full for x in layer_state)

    def result(self) -> tuple:
        return self.state


class RowsState:
    """Whole leaves with a layer index in; the wkv leaf comes back updated in place, the new
    shift rows of every layer are stacked into fresh leaves by ``result`` (see module doc)."""

    def __init__(self, state):
        self.att_shift, self.wkv, self.ffn_shift = state
        self.att_rows, self.ffn_rows = [], []

    def layer(self, i: int) -> tuple:
        return tuple(LayerSlice(leaf, i) for leaf in (self.att_shift, self.wkv, self.ffn_shift))

    def set(self, i: int, layer_state: tuple) -> None:
        att_rows, wkv, ffn_rows = layer_state
        self.att_rows.append(att_rows)
        self.ffn_rows.append(ffn_rows)
        self.wkv = wkv.full

    def result(self) -> tuple:
        return (jnp.stack(self.att_rows, 1).astype(self.att_shift.dtype), self.wkv,
                jnp.stack(self.ffn_rows, 1).astype(self.ffn_shift.dtype))
