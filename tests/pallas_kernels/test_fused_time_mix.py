"""The fused decode time-mix kernels in interpret mode against their plain-jnp references
(fresh seeded inputs): segment_linear, lora_up, wkv_tail, and the three chained against
time_mix_reference, with the state read and written in place inside a [B, L, H, N, N] array.
Interpret mode fills outputs with NaN first, so an unwritten element fails."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import lora_up, segment_linear, wkv_tail
from pallas_kernels.fused_time_mix import fused_channel_mix, fused_time_mix
from pallas_kernels.segment_linear import SplitSum
from pallas_kernels.small_m_linear import linear_reference
from pallas_kernels.sparse_channel_mix import channel_mix_reference
from pallas_kernels.time_mix import TimeMixWeights, lora_up_reference, time_mix_reference
from pallas_kernels.wkv_step import wkv_step_reference

H, N = 2, 64
C = H * N
WIDTHS = {"w": 48, "a": 32, "v": 16, "g": 80}   # LoRA widths not powers of two
WIDE = {"w": 176, "a": 32, "v": 16, "g": 320}    # lora_up multiplies these in several pieces


def _keys(seed, n):
    return iter(jax.random.split(jax.random.key(seed), n))


def _weights(seed, dtype, d=WIDTHS) -> TimeMixWeights:
    ks = _keys(seed, 24)
    mat = lambda o, i: (jax.random.normal(next(ks), (o, i)) / math.sqrt(i)).astype(dtype)  # noqa: E731
    vecs = jnp.stack([jax.random.normal(next(ks), (C,)) for _ in range(7)]) * 0.5
    vecs = vecs.at[5].add(1.0)  # ln_x.weight around 1
    return TimeMixWeights(mat(C, C), mat(C, C), mat(C, C), mat(C, C), mat(d["w"], C), mat(C, d["w"]), mat(d["a"], C),
                          mat(C, d["a"]), mat(d["v"], C), mat(C, d["v"]), mat(d["g"], C), mat(C, d["g"]),
                          vecs, 0.5 * jax.random.normal(next(ks), (H, N)))


def _close(got, want, atol):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("M", [1, 3, 20])
def test_segment_linear_matches_reference(M):
    ks = _keys(M, 4)
    xs = jax.random.normal(next(ks), (6, M, C))
    ws = [jax.random.normal(next(ks), (n, C)) / math.sqrt(C) for n in (C, 48, 80)]
    inputs = [0, 3, 5]
    partials = segment_linear.segment_linear(xs, ws, inputs, interpret=True)
    assert partials.shape[1] == segment_linear.padded_rows(M)
    got = partials.sum(0)
    assert np.all(np.asarray(got[M:]) == 0)   # padded rows are zero
    want = jnp.concatenate(segment_linear.segment_linear_reference(xs, ws, inputs), axis=1)
    _close(got[:M], want, 1e-4)


@pytest.mark.parametrize("M,first,widths", [(1, False, WIDTHS), (3, True, WIDTHS), (1, False, WIDE), (3, False, WIDE),
                                            (20, True, WIDE), (40, False, WIDE)])
def test_lora_up_matches_reference(M, first, widths):
    """Row blocks of 1, 16, 32 and 64 (pieces of 128, 128, 64 and 32 columns)."""
    wts = _weights(10 + M, jnp.float32, widths)
    downs, inputs = wts.down(first)
    xs = jax.random.normal(jax.random.key(M), (6, M, C))
    partials = segment_linear.segment_linear(xs, downs, inputs, interpret=True)
    hidden = segment_linear.segment_linear_reference(xs, downs, inputs)[3:]
    kinds = "wa" + ("" if first else "v") + "g"
    offsets = list(np.cumsum([3 * C] + [h.shape[1] for h in hidden])[:-1])
    got = lora_up.lora_up(partials, wts.ups(first), [int(o) for o in offsets], kinds, M=M,
                          dtype=jnp.float32, interpret=True)
    want = lora_up_reference(hidden, wts.ups(first), kinds, linear_reference)
    for i, w in enumerate(want):
        _close(got[i, :M], w, 1e-4)


@pytest.mark.parametrize("B,first,layer", [(1, False, 2), (3, True, None), (2, False, None)])
def test_fused_time_mix_matches_reference(B, first, layer):
    wts = _weights(B, jnp.float32)
    ks = _keys(100 + B, 3)
    mixed = jax.random.normal(next(ks), (6, B, C))
    v_first = None if first else jax.random.normal(next(ks), (B, C))
    L = 4
    S_all = 0.1 * jax.random.normal(next(ks), (B, L, H, N, N))
    S = S_all if layer is not None else S_all[:, 1]
    want, S_want, vf_want = time_mix_reference(mixed, wts, S_all[:, 1 if layer is None else layer], v_first,
                                               first=first, linear=linear_reference,
                                               wkv=lambda S, *xs: wkv_step_reference(*xs, S))
    got, S_got, vf_got = fused_time_mix(mixed, wts, S, v_first, first=first, layer=layer, interpret=True)
    _close(got.total(), want, 2e-4)
    _close(vf_got, vf_want, 1e-5)
    if layer is None:
        _close(S_got, S_want, 1e-5)
    else:
        _close(S_got[:, layer], S_want, 1e-5)
        others = [i for i in range(L) if i != layer]
        np.testing.assert_array_equal(np.asarray(S_got[:, others]), np.asarray(S_all[:, others]))


@pytest.mark.parametrize("M,dtype", [(1, jnp.float32), (5, jnp.float32), (2, jnp.float16), (1, jnp.bfloat16)])
def test_fused_channel_mix_matches_reference(M, dtype):
    ks = _keys(200 + M, 4)
    F = 4 * C
    xk = jax.random.normal(next(ks), (M, C)).astype(dtype)
    w_key = (jax.random.normal(next(ks), (F, C)) / math.sqrt(C)).astype(dtype)
    w_val = (jax.random.normal(next(ks), (F, C)) / math.sqrt(F)).astype(dtype)
    got = fused_channel_mix(xk, w_key, w_val, interpret=True)
    assert isinstance(got, SplitSum)
    want = channel_mix_reference(xk, w_key, w_val)
    _close(got.total(), want, 1e-4 if dtype == jnp.float32 else 3e-2)
    h = jax.random.normal(next(ks), (M, C)).astype(dtype)
    _close(h + got, h + want, 1e-4 if dtype == jnp.float32 else 6e-2)  # SplitSum adds as its total


@pytest.mark.parametrize("M,dtype", [(1, jnp.bfloat16), (3, jnp.float32)])
def test_fused_channel_mix_skipping_zero_units_is_exact(M, dtype):
    """90 % of the hidden units are zero in every row (their key rows point away from the
    positive inputs): skipping their value rows gives the dense kernel's bits exactly."""
    ks = _keys(300 + M, 4)
    F = 4 * C
    xk = jnp.abs(jax.random.normal(next(ks), (M, C))).astype(dtype)
    off = jax.random.uniform(next(ks), (F, 1)) < 0.9
    w_key = jax.random.normal(next(ks), (F, C)) / math.sqrt(C)
    w_key = jnp.where(off, -jnp.abs(w_key), w_key).astype(dtype)
    w_val = (jax.random.normal(next(ks), (F, C)) / math.sqrt(F)).astype(dtype)
    sparse = fused_channel_mix(xk, w_key, w_val, skip=True, interpret=True)
    dense = fused_channel_mix(xk, w_key, w_val, skip=False, interpret=True)
    np.testing.assert_array_equal(np.asarray(sparse.partials), np.asarray(dense.partials))
    _close(sparse.total(), channel_mix_reference(xk, w_key, w_val), 1e-4 if dtype == jnp.float32 else 3e-2)
    assert np.abs(np.asarray(sparse.total(), np.float32)).max() > 0


def test_wkv_tail_rejects_a_wrong_state():
    wts = _weights(0, jnp.float32)
    partials = jnp.zeros((1, 1, 3 * C + 176))
    with pytest.raises(ValueError, match="S must be float32"):
        wkv_tail.wkv_tail(partials, jnp.zeros((4, 1, C)), wts.vecs, wts.r_k, jnp.zeros((1, C)),
                          jnp.zeros((1, H, N, N), jnp.int32), interpret=True)  # 16-bit float states are valid
