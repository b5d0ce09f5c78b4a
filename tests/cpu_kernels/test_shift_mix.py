"""The native residual add + LayerNorm + token-shift mixes against ``shift_mix_reference`` on
fresh random rows: with and without the residual delta, one and six mixes, the layer's shift
rows read from the whole leaf; the inputs it leaves to the reference; and its one-line error."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpu_kernels import library
from cpu_kernels import shift_mix as native
from pallas_kernels.shift_mix import shift_mix_reference


@pytest.mark.parametrize("n", [1, 6])
@pytest.mark.parametrize("with_delta", [True, False])
def test_matches_the_reference(n, with_delta):
    rng = np.random.default_rng()
    B, L, C = int(rng.integers(1, 13)), int(rng.integers(1, 5)), 16 * int(rng.integers(1, 60))
    layer = int(rng.integers(0, L))
    h = jnp.asarray(rng.standard_normal((B, C)) * 3 + 1, jnp.float32)
    delta = jnp.asarray(rng.standard_normal((B, C)), jnp.float32) if with_delta else None
    shift = jnp.asarray(rng.standard_normal((B, L, C)), jnp.float32)
    ln_w, ln_b = (jnp.asarray(rng.standard_normal(C), jnp.float32) for _ in range(2))
    mix = jnp.asarray(rng.uniform(0, 1, (n, C)), jnp.float32)
    assert native.supports(h, shift)
    h_out, mixed, x = jax.jit(native.shift_mix, static_argnums=3)(h, delta, shift, layer, ln_w, ln_b, mix)
    want_h, want_mixed, want_x = shift_mix_reference(h, delta, shift[:, layer], ln_w, ln_b, mix)
    np.testing.assert_array_equal(np.asarray(h_out), np.asarray(want_h))
    np.testing.assert_allclose(np.asarray(x), np.asarray(want_x), rtol=1e-5, atol=1e-5)
    assert len(mixed) == n and mixed.shape == want_mixed.shape and mixed.dtype == jnp.float32
    for i in range(n):
        np.testing.assert_allclose(np.asarray(mixed[i]), np.asarray(want_mixed[i]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["bfloat16 rows", "bfloat16 shift", "C not a multiple of 16"])
def test_inputs_it_does_not_take(case):
    C = 40 if case == "C not a multiple of 16" else 64
    h = jnp.zeros((2, C), jnp.bfloat16 if case == "bfloat16 rows" else jnp.float32)
    shift = jnp.zeros((2, 3, C), jnp.bfloat16 if case == "bfloat16 shift" else jnp.float32)
    assert not native.supports(h, shift)


def test_a_layer_past_the_leaf_fails_in_one_line():
    library.load()
    h, shift = jnp.ones((2, 32), jnp.float32), jnp.ones((2, 3, 32), jnp.float32)
    vec, mix = jnp.ones(32, jnp.float32), jnp.ones((1, 32), jnp.float32)
    rows = jax.ShapeDtypeStruct((2, 32), jnp.float32)
    call = jax.ffi.ffi_call("rwkv7_shift_mix", (rows, rows, rows))
    with pytest.raises(Exception, match="rwkv7_shift_mix: want .* 0 <= layer < L"):
        jax.block_until_ready(call(h, shift, vec, vec, mix, layer=np.int64(3), eps=np.float32(1e-5)))
