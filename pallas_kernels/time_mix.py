"""The RWKV-7 time-mix body between the token-shift mixes and the output projection, as plain
jnp (the model's XLA op and the reference of the fused decode kernels).

Per layer, with mixed [6, M, C] (order r w k v a g) in the model dtype:
    r, k, v          = receptance / key / value products
    w_l, a_l, v_l, g = the LoRA pairs (``lora_up_reference``): tanh, none, none, sigmoid between
                       the down and up products
    r, w, k, v, kk, a = ``wkv_operands_reference`` (decay, ``a``, ``kk`` normalisation, the ``a``
                       key mix, the value mix with the first layer's value; one helper each)
    y, S'            = the wkv recurrence (the layout's: one step or a sequence)
    out              = ``wkv_output_reference`` (GroupNorm per head, bonus, gate), model dtype,
                       then the output projection
Every product rounds to the model dtype and the rest runs in float32, as in the official model.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from rwkv7_core.constants import DECAY_SCALE, GROUP_NORM_EPS, KK_EPS

F32 = jnp.float32
MIX_INDEX = {"r": 0, "w": 1, "k": 2, "v": 3, "a": 4, "g": 5}


class TimeMixWeights(NamedTuple):
    """One layer's time-mix arrays ([out, in] matrices in the model dtype; vecs [7, C] float32
    rows w0 a0 v0 k_k k_a ln_x.weight ln_x.bias; r_k [H, N] float32)."""

    receptance: jax.Array
    key: jax.Array
    value: jax.Array
    output: jax.Array
    w1: jax.Array
    w2: jax.Array
    a1: jax.Array
    a2: jax.Array
    v1: jax.Array
    v2: jax.Array
    g1: jax.Array
    g2: jax.Array
    vecs: jax.Array
    r_k: jax.Array

    def down(self, first: bool):
        """(weights, mix index) of every product on the mixes: r, k, v, then the LoRA downs."""
        names = ["receptance", "key", "value", "w1", "a1"] + ([] if first else ["v1"]) + ["g1"]
        mixes = "rkvwa" + ("" if first else "v") + "g"
        return [getattr(self, n) for n in names], [MIX_INDEX[m] for m in mixes]

    def ups(self, first: bool):
        """The LoRA up weights [C, d] in the order of lora_up_reference's outputs."""
        return [self.w2, self.a2] + ([] if first else [self.v2]) + [self.g2]

    @staticmethod
    def up_kinds(first: bool) -> str:
        """The kinds ("w" / "a" / "v" / "g") of the LoRA up products, in the order of ``ups``."""
        return "wa" + ("" if first else "v") + "g"


LORA_ACTIVATIONS = {"w": jnp.tanh, "a": None, "v": None, "g": jax.nn.sigmoid}


def each_product(pairs, linear):
    """[linear(x, w) for (x, w) in pairs]: the ``products`` of ops that run each product alone."""
    return [linear(x, w) for x, w in pairs]


def lora_up_reference(hidden, ups, kinds, linear, products=None):
    """hidden: down products [M, d_i] (model dtype), ups: [C, d_i] weights, kinds: "w"/"a"/"v"/"g"
    -> the up products [M, C] (model dtype) of act(hidden_i) (tanh for w, sigmoid for g).
    products(pairs) gives [linear(x, w) for (x, w) in pairs] (default ``each_product``)."""
    acts = [LORA_ACTIVATIONS[kind] for kind in kinds]
    pairs = [(h if act is None else act(h), w) for h, w, act in zip(hidden, ups, acts)]
    return products(pairs) if products else each_product(pairs, linear)


def log_decay(w0, w_l):
    """log of the decay multiplier w = exp(-DECAY_SCALE * sigmoid(w0 + w_l)), float32 (any
    broadcastable shapes)."""
    return -DECAY_SCALE * jax.nn.sigmoid(w0 + w_l.astype(F32))


def in_context_rate(a0, a_l):
    """a = sigmoid(a0 + a_l), float32."""
    return jax.nn.sigmoid(a0 + a_l.astype(F32))


def normalized_key(k, k_k):
    """kk = k * k_k L2-normalised over the last axis (one head's N channels), float32."""
    kk = k * k_k
    return kk / jnp.maximum(jnp.sqrt(jnp.sum(kk * kk, axis=-1, keepdims=True)), KK_EPS)


def key_mix(k, a, k_a):
    """The key after the ``a`` mix: k * (1 + (a - 1) * k_a)."""
    return k * (1 + (a - 1) * k_a)


def value_mix(v, v_first, v0, v_l):
    """The value mixed with the first layer's: v + (v_first - v) * sigmoid(v0 + v_l), float32."""
    return v + (v_first - v) * jax.nn.sigmoid(v0 + v_l.astype(F32))


def wkv_operands_reference(r, k, v, w_l, a_l, v_l, vecs, v_first, *, n_head: int):
    """Products r, k, v, LoRA outputs w_l, a_l, v_l (None on the first layer) [M, C] (any dtype),
    vecs [7, C], v_first [M, C] float32 (None on the first layer) -> (r, w, k, v, kk, a,
    v_first) [M, C] float32: the wkv operands and the first layer's value."""
    w0, a0, v0, k_k, k_a = vecs[:5]
    r, k, v = (x.astype(F32) for x in (r, k, v))
    M, C = r.shape
    w = jnp.exp(log_decay(w0, w_l))
    a = in_context_rate(a0, a_l)
    kk = normalized_key(k.reshape(M, n_head, -1), k_k.reshape(n_head, -1)).reshape(M, C)
    k = key_mix(k, a, k_a)
    if v_first is None:
        v_first = v
    else:
        v = value_mix(v, v_first, v0, v_l)
    return r, w, k, v, kk, a, v_first


def head_norm(y):
    """y normalised over the last axis (one head's N channels: GroupNorm without its affine)."""
    mean = y.mean(-1, keepdims=True)
    var = jnp.square(y - mean).mean(-1, keepdims=True)
    return (y - mean) * jax.lax.rsqrt(var + GROUP_NORM_EPS)


def bonus(r, k, r_k, v):
    """The current token's direct term per head (last axis N): sum(r * k * r_k) * v."""
    return jnp.sum(r * k * r_k, axis=-1, keepdims=True) * v


def wkv_output_reference(y, r, k, v, g, vecs, r_k, dtype):
    """y [M, H, N] float32 (wkv output), r, k, v [M, C] float32 (k after the a mix), g [M, C],
    vecs [7, C], r_k [H, N] -> GroupNorm(y) per head + bonus, times the gate: [M, C] in dtype."""
    M, H, N = y.shape
    lnx_w, lnx_b = vecs[5], vecs[6]
    heads = lambda x: x.reshape(M, H, N)  # noqa: E731
    y = head_norm(y).reshape(M, H * N) * lnx_w + lnx_b
    y = y + bonus(heads(r), heads(k), r_k, heads(v)).reshape(M, H * N)
    return (y * g.astype(F32)).astype(dtype)


def time_mix_reference(mixed, wts: TimeMixWeights, S, v_first, *, first: bool, linear: Callable,
                       wkv: Callable, operands: Callable = wkv_operands_reference,
                       output: Callable = wkv_output_reference, products: Callable | None = None):
    """mixed [6, M, C], S (state rows for `wkv`), v_first [M, C] float32 | None -> (out [M, C]
    model dtype, after the output projection; S'; v_first). linear(x, w) is the product op,
    wkv(S, r, w, k, v, kk, a) with operands [M, H, N] the layout's recurrence; `operands` and
    `output` are ``wkv_operands_reference`` and ``wkv_output_reference`` or kernels with their
    contracts (the prefill's: ``pallas_kernels.wkv_operands``, ``pallas_kernels.wkv_output``);
    products(pairs) gives [linear(x, w) for (x, w) in pairs] at once (the products on the mixes,
    then the LoRA up products; default ``each_product``)."""
    _, M, C = mixed.shape
    H, N = wts.r_k.shape
    downs, inputs = wts.down(first)
    pairs = [(mixed[j], w) for w, j in zip(downs, inputs)]
    r, k, v, *hidden = products(pairs) if products else each_product(pairs, linear)
    ups = lora_up_reference(hidden, wts.ups(first), wts.up_kinds(first), linear, products)
    w_l, a_l, g = ups[0], ups[1], ups[-1]
    v_l = None if first else ups[2]
    r, w, k, v, kk, a, v_first = operands(r, k, v, w_l, a_l, v_l, wts.vecs, v_first, n_head=H)
    y, S = wkv(S, *(x.reshape(M, H, N) for x in (r, w, k, v, kk, a)))
    out = output(y, r, k, v, g, wts.vecs, wts.r_k, mixed.dtype)
    return linear(out, wts.output), S, v_first
