"""The native residual add + LayerNorm + token-shift mixes against ``shift_mix_reference`` on
fresh random rows: float32 and bfloat16, with and without the residual delta, one and six mixes,
the layer's shift rows read from the whole leaf; the inputs it leaves to the reference; and its
one-line error."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpu_kernels import library
from cpu_kernels import shift_mix as native
from pallas_kernels.shift_mix import shift_mix_reference


def assert_within_a_rounding(got, want, dtype):
    """float32: the reference to float32 precision (another summation order); bfloat16: within
    one rounding of the largest value, and nearly every value the same (the same rounding)."""
    got, want = np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32))
    if dtype == jnp.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert np.abs(got - want).max() <= 2.0 ** -7 * np.abs(want).max()
        assert np.mean(got == want) > 0.97


@pytest.mark.parametrize("n", [1, 6])
@pytest.mark.parametrize("with_delta", [True, False])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matches_the_reference(dtype, n, with_delta):
    rng = np.random.default_rng()
    B, L, C = int(rng.integers(1, 13)), int(rng.integers(1, 5)), 16 * int(rng.integers(1, 60))
    layer = int(rng.integers(0, L))
    h = jnp.asarray(rng.standard_normal((B, C)) * 3 + 1, dtype)
    delta = jnp.asarray(rng.standard_normal((B, C)), jnp.float32) if with_delta else None
    shift = jnp.asarray(rng.standard_normal((B, L, C)), dtype)
    ln_w, ln_b = (jnp.asarray(rng.standard_normal(C), jnp.float32) for _ in range(2))
    mix = jnp.asarray(rng.uniform(0, 1, (n, C)), jnp.float32)
    assert native.supports(h, shift)
    h_out, mixed, x = jax.jit(native.shift_mix, static_argnums=3)(h, delta, shift, layer, ln_w, ln_b, mix)
    want_h, want_mixed, want_x = shift_mix_reference(h, delta, shift[:, layer], ln_w, ln_b, mix)
    assert h_out.dtype == x.dtype == dtype
    np.testing.assert_array_equal(np.asarray(h_out.astype(jnp.float32)), np.asarray(want_h.astype(jnp.float32)))
    assert_within_a_rounding(x, want_x, dtype)
    assert len(mixed) == n and mixed.shape == want_mixed.shape and mixed.dtype == dtype
    for i in range(n):
        assert_within_a_rounding(mixed[i], want_mixed[i], dtype)


@pytest.mark.parametrize("case", ["bfloat16 rows", "bfloat16 shift", "float16", "C not a multiple of 16"])
def test_inputs_it_does_not_take(case):
    C = 40 if case == "C not a multiple of 16" else 64
    rows = {"bfloat16 rows": jnp.bfloat16, "float16": jnp.float16}.get(case, jnp.float32)
    h = jnp.zeros((2, C), rows)
    shift = jnp.zeros((2, 3, C), {"bfloat16 shift": jnp.bfloat16, "float16": jnp.float16}.get(case, jnp.float32))
    assert not native.supports(h, shift)


def test_a_layer_past_the_leaf_fails_in_one_line():
    library.load()
    h, shift = jnp.ones((2, 32), jnp.float32), jnp.ones((2, 3, 32), jnp.float32)
    vec, mix = jnp.ones(32, jnp.float32), jnp.ones((1, 32), jnp.float32)
    rows = jax.ShapeDtypeStruct((2, 32), jnp.float32)
    call = jax.ffi.ffi_call("rwkv7_shift_mix", (rows, rows, rows))
    with pytest.raises(Exception, match="rwkv7_shift_mix: want .* 0 <= layer < L"):
        jax.block_until_ready(call(h, shift, vec, vec, mix, layer=np.int64(3), eps=np.float32(1e-5)))
