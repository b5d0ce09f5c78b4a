"""The native recurrence step against ``wkv_step_reference`` on fresh random inputs: the stepped
layer's rows and outputs, the other layers untouched, and the leaf updated in place (no copy);
float32, bfloat16 and float16 states."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpu_kernels import library
from cpu_kernels import wkv_step as native
from pallas_kernels.wkv_step import wkv_step_reference


def operands(rng, B: int, H: int, N: int):
    r, k, v = (jnp.asarray(rng.standard_normal((B, H, N)), jnp.float32) for _ in range(3))
    w = jnp.asarray(rng.uniform(0.5, 1.0, (B, H, N)), jnp.float32)
    kk = rng.standard_normal((B, H, N)).astype(np.float32)
    kk = jnp.asarray(kk / np.linalg.norm(kk, axis=-1, keepdims=True))
    a = jnp.asarray(rng.uniform(0, 1, (B, H, N)), jnp.float32)
    return r, w, k, v, kk, a


@pytest.mark.parametrize("B,L,H,N", [(1, 3, 2, 64), (5, 2, 3, 64), (3, 4, 1, 32), (2, 2, 3, 16), (2, 2, 1, 128)])
def test_matches_the_reference_on_its_layer_only(B, L, H, N):
    rng = np.random.default_rng()
    layer = int(rng.integers(0, L))
    xs = operands(rng, B, H, N)
    S = jnp.asarray(rng.standard_normal((B, L, H, N, N)), jnp.float32)
    before = np.asarray(S)
    y, new = jax.jit(native.wkv_step, static_argnums=7)(*xs, S, layer)
    want_y, want_rows = wkv_step_reference(*xs, jnp.asarray(before[:, layer]))
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(new)[:, layer], np.asarray(want_rows), rtol=1e-5, atol=1e-5)
    others = [i for i in range(L) if i != layer]
    np.testing.assert_array_equal(np.asarray(new)[:, others], before[:, others])


def test_a_donated_leaf_is_stepped_in_place():
    rng = np.random.default_rng()
    xs = operands(rng, 2, 2, 64)
    S = jnp.asarray(rng.standard_normal((2, 3, 2, 64, 64)), jnp.float32)

    def two_layers(xs, S):
        y0, S = native.wkv_step(*xs, S, 0)
        y1, S = native.wkv_step(*xs, S, 2)
        return y0 + y1, S

    compiled = jax.jit(two_layers, donate_argnums=1).lower(xs, S).compile()
    entry = compiled.as_text()[compiled.as_text().index("\nENTRY"):]
    assert entry.count("custom-call(") == 2 and " copy(" not in entry


STATE_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}
ULP = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # half the spacing of values in [1, 2)


@pytest.mark.parametrize("name", list(STATE_DTYPES))
def test_a_16_bit_state_is_stepped_in_float32_and_rounded_once(name):
    """The state widened as it is read, the step in float32, each value rounded to nearest once as
    it is written: the reference's rows within one rounding of the 16-bit value (the float32 sums
    come in another order), y from the unrounded step (the reference's to float32 precision)."""
    dtype = STATE_DTYPES[name]
    if not native.supports(jnp.zeros((1, 1, 1, 64, 64), dtype)):
        pytest.skip(f"this build of the native kernels has no {name} state ({library.load().capabilities})")
    rng = np.random.default_rng()
    B, L, H, N = int(rng.integers(1, 5)), 3, 2, 64
    layer = int(rng.integers(0, L))
    xs = operands(rng, B, H, N)
    S = jnp.asarray(rng.standard_normal((B, L, H, N, N)), dtype)
    before = np.asarray(S.astype(jnp.float32))
    y, new = jax.jit(native.wkv_step, static_argnums=7)(*xs, S, layer)
    assert new.dtype == dtype
    want_y, want_rows = wkv_step_reference(*xs, S[:, layer])
    np.testing.assert_allclose(np.asarray(y), np.asarray(want_y), rtol=1e-5, atol=1e-4)
    got, want = (np.asarray(x.astype(jnp.float32)) for x in (new[:, layer], want_rows))
    np.testing.assert_allclose(got, want, rtol=2 * ULP[name], atol=1e-6)
    assert np.mean(got == want) > 0.99  # nearly every value the same rounding
    others = [i for i in range(L) if i != layer]
    np.testing.assert_array_equal(np.asarray(new.astype(jnp.float32))[:, others], before[:, others])


def test_other_states_are_not_taken():
    assert native.supports(jnp.zeros((1, 1, 1, 64, 64), jnp.float32))
    assert native.supports(jnp.zeros((1, 1, 1, 64, 64), jnp.bfloat16))
    assert native.supports(jnp.zeros((1, 1, 1, 64, 64), jnp.float16)) == (library.HALF_STATE in library.load().capabilities)
    assert native.supports(jnp.zeros((1, 1, 1, 128, 128), jnp.float32))
    assert not native.supports(jnp.zeros((1, 1, 1, 8, 8), jnp.float32))
    assert not native.supports(jnp.zeros((1, 1, 1, 48, 48), jnp.float32))
    assert not native.supports(jnp.zeros((1, 1, 1, 64, 64), jnp.int32))
