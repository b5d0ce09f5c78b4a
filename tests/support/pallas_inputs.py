"""Seeded random operands for the kernels, shared by the parity tests and the GPU check.

Every generator takes a seed and the sizes and returns operands in the layout of the
kernel-op contract (rwkv_jax.ops): realistic ranges (decays in [0.545, 1), unit-norm kk,
weights scaled by 1/sqrt(fan_in)).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _keys(seed: int, n: int):
    return jax.random.split(jax.random.key(seed), n)


def wkv_inputs(seed: int, lead: tuple[int, ...], H: int, N: int = 64):
    """r, w, k, v, kk, a [*lead, H, N] float32 and S [lead[0], H, N, N] float32."""
    ks = _keys(seed, 7)
    shape = (*lead, H, N)
    r, k, v = (jax.random.normal(ks[i], shape) for i in range(3))
    w = jax.random.uniform(ks[3], shape, minval=0.545, maxval=1.0)
    kk = jax.random.normal(ks[4], shape)
    kk = kk / jnp.linalg.norm(kk, axis=-1, keepdims=True)
    a = jax.random.uniform(ks[5], shape)
    return (r, w, k, v, kk, a, 0.1 * jax.random.normal(ks[6], (lead[0], H, N, N)))


def mix_inputs(seed: int, B: int, C: int, n: int, dtype):
    """h, delta, shift [B, C], ln_w, ln_b [C] float32, mix [n, C] (shift_mix's operands)."""
    ks = _keys(seed, 6)
    h, delta, shift = (jax.random.normal(ks[i], (B, C)).astype(dtype) for i in range(3))
    ln_w = 1 + 0.1 * jax.random.normal(ks[3], (C,))
    ln_b = 0.1 * jax.random.normal(ks[4], (C,))
    return (h, delta, shift, ln_w, ln_b, jax.random.uniform(ks[5], (n, C)).astype(dtype))


def linear_inputs(seed: int, M: int, N: int, K: int, dtype):
    """x [M, K] and w [N, K] (stored [out, in])."""
    k1, k2 = _keys(seed, 2)
    return (jax.random.normal(k1, (M, K)).astype(dtype),
            (jax.random.normal(k2, (N, K)) / math.sqrt(K)).astype(dtype))


def ffn_inputs(seed: int, M: int, C: int, F: int, dtype):
    """xk [M, C], w_key [F, C], w_val_t [F, C] (the model's channel-mix layout)."""
    k1, k2, k3 = _keys(seed, 3)
    return (jax.random.normal(k1, (M, C)).astype(dtype),
            (jax.random.normal(k2, (F, C)) / math.sqrt(C)).astype(dtype),
            (jax.random.normal(k3, (F, C)) / math.sqrt(F)).astype(dtype))


def varlen_wkv_inputs(seed: int, lengths, H: int, N: int = 64, pad: int = 0):
    """r, w, k, v, kk, a [sum(lengths) + pad, H, N], S [P, H, N, N] float32 and cu_seqlens
    int32 [P + 1] (``pallas_kernels.wkv_chunk_varlen``'s operands)."""
    *xs, _ = wkv_inputs(seed, (sum(lengths) + pad,), H, N)
    S = wkv_inputs(seed + 1, (len(lengths),), H, N)[-1]
    cu = jnp.cumsum(jnp.asarray([0, *lengths], jnp.int32), dtype=jnp.int32)
    return (*xs, S, cu)


def wkv_products(seed: int, M: int, C: int, dtype=jnp.bfloat16):
    """The time-mix products ``wkv_operands_reference`` takes: r, k, v, w_l, a_l, v_l [M, C] in
    dtype, vecs [7, C] float32 (w0, a0, v0 ~ N(0, 1), k_k in [0.5, 1.5), k_a in [0, 1), ln_x
    weight ~ 1 and bias ~ 0), v_first [M, C] float32."""
    ks = _keys(seed, 11)
    products = [jax.random.normal(ks[i], (M, C)).astype(dtype) for i in range(6)]
    vecs = jnp.stack([*jax.random.normal(ks[6], (3, C)), jax.random.uniform(ks[7], (C,), minval=0.5, maxval=1.5),
                      jax.random.uniform(ks[8], (C,)), 1 + 0.1 * jax.random.normal(ks[9], (C,)),
                      0.1 * jax.random.normal(ks[10], (C,))])
    return (*products, vecs, jax.random.normal(ks[6], (M, C)))
