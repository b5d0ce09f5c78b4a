"""How the layer loop hands each layer its piece of the recurrent state.

``SlicedState`` (every path but the fused decode): layer i gets ``leaf[:, i]`` of each leaf and
its new rows are written back into the (donated) leaves layer by layer: each layer's slice is
read before it is overwritten, so XLA updates the buffer in place (stacking the new layers
instead made XLA:GPU copy the whole wkv state first: 100 MB per step at 1.5b, B=8, measured
deviceless). ``InPlaceState`` (the fused decode kernels):
layer i gets ``LayerSlice(leaf, i)``, the whole [B, L, ...] leaf and the layer its kernels read
and write in place (their outputs alias their inputs), so no slice of the state is ever
materialised; each layer's updated leaves are what the next layer reads.
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
