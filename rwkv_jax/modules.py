"""Flax NNX modules of RWKV-7: time-mix, channel-mix, block and the whole model.

Built from checkpoint tensors (numpy or device arrays) or as zeros (for an abstract
skeleton). Every matrix but one is stored ``[out, in]`` (the low-rank ``w1 a1 v1 g1`` /
``w2 a2 v2 g2`` transposed from the checkpoint's ``x @ W`` layout) so those products go
through ``Ops.linear``; the channel-mix value weight is stored ``[F, C]`` (one contiguous
row per hidden unit, for the sparse channel-mix, see ``Ops.channel_mix``); per-channel
vectors that feed float32 math (LayerNorm, decay, ``a``, ``kk``, GroupNorm) are kept
float32. Each layer owns its own arrays (see ``forward.py`` on unrolled layers). With a
quantization spec (``rwkv7_core.quantization``) the large projections are ``QuantizedParam``s
(q and float32 scales, all [out, in] (int4 q packed [out, in / 2]), the channel-mix value too:
``pallas_kernels.quantized``),
which ``[...]`` reads as a ``QuantizedWeight``.

The layer code runs on flat rows [M, C]; a ``rwkv_jax.layouts`` layout says how the rows
belong to sequences (token shift, wkv recurrence, which rows give logits).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.shift_mix import layer_norm
from pallas_kernels.time_mix import TimeMixWeights
from rwkv7_core.config import ModelConfig
from rwkv7_core.quantization import (
    GROUPED,
    STORAGE_DTYPES,
    QuantSpec,
    quantize,
    quantized_key,
    scale_key,
    scale_shape,
    stored_shape,
)

from .layouts import Layout
from .ops import Ops

F32 = jnp.float32
TIME_MIX_VECS = ("w0", "a0", "v0", "k_k", "k_a", "ln_x.weight", "ln_x.bias")


class QuantizedParam(nnx.Module):
    """A quantized matrix: q (int8 | float8_e4m3fn | packed int4 uint8) and its float32 scales (see
    ``pallas_kernels.quantized``); ``[...]`` gives the ``QuantizedWeight``."""

    def __init__(self, q, scale):
        self.q, self.scale = nnx.Param(q), nnx.Param(scale)

    def __getitem__(self, index) -> QuantizedWeight:
        return QuantizedWeight(self.q[index], self.scale[index])


class Tensors:
    """Checkpoint tensors (numpy or jax arrays) -> jax arrays in a target dtype; None builds
    zeros of each shape. With `quant`, ``matrix`` gives the quantized projections as
    QuantizedParams, quantized here from float tensors or taken as stored (a quantized
    checkpoint, already validated)."""

    def __init__(self, tensors: Mapping[str, Any] | None, dtype, quant: QuantSpec | None = None):
        self.tensors, self.dtype, self.quant = tensors, dtype, quant

    def matrix(self, key: str, shape: tuple[int, int], transpose: bool = False):
        """A projection weight of `shape` ([out, in], or [in, out] with transpose); quantized,
        always the checkpoint's [out, in]."""
        if self.quant is None or not quantized_key(key):
            return self.get(key, shape, transpose=transpose)
        source = shape[::-1] if transpose else shape
        if self.tensors is None:
            q = np.zeros(stored_shape(self.quant, source), STORAGE_DTYPES[self.quant.scheme])
            scale = np.zeros(scale_shape(self.quant, source), np.float32)
        elif scale_key(key) in self.tensors:
            q, scale = self.tensors[key], self.tensors[scale_key(key)]
        else:
            q, scale = quantize(np.asarray(self.tensors[key]), self.quant, key)
        return QuantizedParam(jnp.asarray(q), jnp.asarray(scale))

    def get(self, key: str, shape: tuple[int, ...], dtype=None, transpose: bool = False) -> nnx.Param:
        dtype = dtype or self.dtype
        if self.tensors is None:
            return nnx.Param(jnp.zeros(shape, dtype))
        a = jnp.asarray(self.tensors[key], F32)
        a = a.T if transpose else a
        return nnx.Param(a.reshape(shape).astype(dtype))

    def rows(self, keys: list[str], width: int, dtype=None) -> nnx.Param:
        """Stack 1-element-per-channel tensors (any of shapes (C,), (1,1,C)) as [len(keys), C]."""
        dtype = dtype or self.dtype
        if self.tensors is None:
            return nnx.Param(jnp.zeros((len(keys), width), dtype))
        return nnx.Param(jnp.stack([jnp.asarray(self.tensors[k], F32).reshape(width) for k in keys]).astype(dtype))


class TimeMix(nnx.Module):
    """Attention-like mixing with the wkv recurrence (one layer)."""

    def __init__(self, config: ModelConfig, layer_id: int, t: Tensors):
        C, H, N = config.n_embd, config.n_head, config.head_size
        p = f"blocks.{layer_id}.att."
        self.layer_id, self.n_head, self.head_size = layer_id, H, N
        self.mix = t.rows([p + f"x_{n}" for n in "rwkvag"], C)
        self.vecs = t.rows([p + n for n in TIME_MIX_VECS], C, F32)  # TimeMixWeights.vecs order
        self.r_k = t.get(p + "r_k", (H, N), F32)
        for name in ("receptance", "key", "value", "output"):
            setattr(self, name, t.matrix(p + name + ".weight", (C, C)))
        widths = {"w": config.d_decay, "a": config.d_aaa, "v": config.d_mv, "g": config.d_gate}
        for n, d in widths.items():  # stored [out, in]
            setattr(self, n + "1", t.get(p + n + "1", (d, C), transpose=True))
            setattr(self, n + "2", t.get(p + n + "2", (C, d), transpose=True))

    def weights(self) -> TimeMixWeights:
        return TimeMixWeights(*(getattr(self, n)[...] for n in TimeMixWeights._fields))

    def __call__(self, mixed, S, v_first, *, ops: Ops, rows: Layout):
        """mixed [6, M, C] (order r w k v a g), S (the layout's state rows, float32),
        v_first [M, C] float32 | None -> (out [M, C] model dtype after the output projection (or
        its split-K partials, see Ops.time_mix), S_new, v_first)."""
        return ops.time_mix(mixed, self.weights(), S, v_first, first=self.layer_id == 0,
                            wkv=lambda S, *xs: rows.wkv(ops, S, *xs))


class ChannelMix(nnx.Module):
    """The squared-ReLU feed-forward (one layer)."""

    def __init__(self, config: ModelConfig, layer_id: int, t: Tensors):
        C, F = config.n_embd, config.dim_ffn
        p = f"blocks.{layer_id}.ffn."
        self.mix = t.rows([p + "x_k"], C)
        self.key = t.matrix(p + "key.weight", (F, C))
        self.value = t.matrix(p + "value.weight", (F, C), transpose=True)  # [F, C]: see Ops

    def __call__(self, xk, *, ops: Ops):
        """xk [M, C] -> [M, C]; the value weight is held [F, C] (one row per hidden unit)."""
        return ops.channel_mix(xk, self.key[...], self.value[...])


class Block(nnx.Module):
    """One layer: LN1 + time-mix and LN2 + channel-mix, each with a token shift."""

    def __init__(self, config: ModelConfig, layer_id: int, t: Tensors):
        p = f"blocks.{layer_id}."
        C = config.n_embd
        # one array each (not stacked): a kernel operand that is a slice costs a copy on the GPU
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = (
            t.get(p + name, (C,), F32) for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"))
        self.att = TimeMix(config, layer_id, t)
        self.ffn = ChannelMix(config, layer_id, t)

    def __call__(self, h, delta, layer_state, v_first, *, ops: Ops, rows: Layout):
        """h [M, C]; delta [M, C] | None (the previous layer's channel-mix output, not yet
        added); layer_state (att_shift, wkv, ffn_shift) in the layout's state rows
        -> (h, delta, layer_state, v_first)."""
        att_shift, S, ffn_shift = layer_state
        ln1_w, ln1_b, ln2_w, ln2_b = (x[...] for x in (self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b))
        h, mixed, att_shift = rows.shift_mix(ops, h, delta, att_shift, ln1_w, ln1_b, self.att.mix[...])
        att_out, S, v_first = self.att(mixed, S, v_first, ops=ops, rows=rows)
        h, mixed, ffn_shift = rows.shift_mix(ops, h, att_out, ffn_shift, ln2_w, ln2_b, self.ffn.mix[...])
        return h, self.ffn(mixed[0], ops=ops), (att_shift, S, ffn_shift), v_first


class RWKV7(nnx.Module):
    """The whole model: embedding + LN0, the blocks, LN_out and the head."""

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Any] | None = None, dtype=F32,
                 quant: QuantSpec | None = None):
        t = Tensors(tensors, dtype, quant)
        C, V = config.n_embd, config.vocab_size
        self.emb = t.get("emb.weight", (V, C))
        self.ln = t.rows(["blocks.0.ln0.weight", "blocks.0.ln0.bias", "ln_out.weight", "ln_out.bias"], C, F32)
        self.head = t.matrix("head.weight", (V, C))
        self.blocks = nnx.List([Block(config, layer, t) for layer in range(config.n_layer)])

    def __call__(self, tokens, state, *, ops: Ops, rows: Layout):
        """tokens int32 [M] (flat rows), state (att_shift [P, L, C], wkv [P, L, H, N, N],
        ffn_shift [P, L, C]) -> (logits float32 [rows.outputs rows, V], new state)."""
        ln0_w, ln0_b, lnout_w, lnout_b = self.ln[...]
        h = layer_norm(jnp.take(self.emb[...], tokens, axis=0), ln0_w, ln0_b)
        delta, v_first, states = None, None, ops.state_views(state)
        for layer, block in enumerate(self.blocks):
            h, delta, layer_state, v_first = block(h, delta, states.layer(layer), v_first, ops=ops, rows=rows)
            states.set(layer, layer_state)
        h = rows.outputs(h + delta)
        logits = ops.linear(layer_norm(h, lnout_w, lnout_b), self.head[...]).astype(F32)
        return logits, states.result()


def quant_spec_of(params: dict) -> QuantSpec | None:
    """The QuantSpec a pure param dict of RWKV7 was built with (from its head's structure,
    dtype and scale shape; works on tracers), None when unquantized."""
    head = params["head"]
    if not isinstance(head, dict):
        return None
    scheme = next(name for name, dtype in STORAGE_DTYPES.items() if head["q"].dtype == dtype)
    width = head["q"].shape[1] * (2 if scheme == "int4" else 1)
    return QuantSpec(scheme, width // head["scale"].shape[1] if scheme in GROUPED else 0)
