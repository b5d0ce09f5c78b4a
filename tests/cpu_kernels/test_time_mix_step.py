"""The native time-mix body (``cpu_kernels.wkv_step.time_mix_step``) against the references it
fuses (``wkv_operands_reference``, ``wkv_step_reference``, ``wkv_output_reference``) on fresh
random inputs: its output in the model dtype, the stepped layer's state rows, the other layers
untouched, the first layer's v_first; float32, bfloat16 and float16 models, 16-bit states."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpu_kernels import library
from cpu_kernels import wkv_step as native
from pallas_kernels.time_mix import wkv_operands_reference, wkv_output_reference
from pallas_kernels.wkv_step import wkv_step_reference

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# the output's largest difference over its largest value: a float32 sum order, or one rounding of
# the model dtype (bfloat16 keeps 8 bits, float16 11)
OUT_TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def inputs(rng, B: int, H: int, N: int, first: bool):
    """Product results r k v w_l a_l v_l g [B, C] float32, vecs [7, C], r_k [H, N], v_first."""
    C = H * N
    products = [jnp.asarray(rng.standard_normal((B, C)), jnp.float32) for _ in range(7)]
    vecs = np.stack([rng.standard_normal(C), rng.standard_normal(C), rng.standard_normal(C),
                     rng.uniform(0.5, 1.5, C), rng.uniform(0, 1, C), rng.uniform(0.5, 1.5, C), 0.1 * rng.standard_normal(C)])
    r_k = jnp.asarray(rng.standard_normal((H, N)), jnp.float32)
    v_first = None if first else jnp.asarray(rng.standard_normal((B, C)), jnp.float32)
    return products, jnp.asarray(vecs, jnp.float32), r_k, v_first


def reference(products, vecs, r_k, v_first, S_rows, dtype):
    """The contract: the products rounded to dtype, the operands, one step, the output."""
    r, k, v, w_l, a_l, v_l, g = (x.astype(dtype) for x in products)
    B, C = r.shape
    H, N = r_k.shape
    r, w, k, v, kk, a, v_first = wkv_operands_reference(r, k, v, w_l, a_l, None if v_first is None else v_l, vecs,
                                                        v_first, n_head=H)
    y, rows = wkv_step_reference(*(x.reshape(B, H, N) for x in (r, w, k, v, kk, a)), S_rows)
    return wkv_output_reference(y, r, k, v, g, vecs, r_k, dtype), rows, v_first


def skip_unless_taken(S, dtype):
    if not native.time_mix_supports(S, dtype):
        pytest.skip(f"this build of the native kernels does not take a {S.dtype} state with a {jnp.dtype(dtype)} "
                    f"model ({library.load().capabilities})")


@pytest.mark.parametrize("N", [16, 64, 128])
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("name", list(DTYPES))
def test_matches_the_references_it_fuses(name, first, N):
    dtype = DTYPES[name]
    rng = np.random.default_rng()
    B, L, H = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    layer = int(rng.integers(0, L))
    S = jnp.asarray(rng.standard_normal((B, L, H, N, N)), jnp.float32)
    skip_unless_taken(S, dtype)
    products, vecs, r_k, v_first = inputs(rng, B, H, N, first)
    before = np.asarray(S)
    step = jax.jit(native.time_mix_step, static_argnums=(11, 12))
    out, new, got_first = step(*products, vecs, r_k, v_first, S, layer, dtype)
    want_out, want_rows, want_first = reference(products, vecs, r_k, v_first, jnp.asarray(before[:, layer]), dtype)
    assert out.dtype == dtype and out.shape == (B, H * N)
    got, want = (np.asarray(x.astype(jnp.float32)) for x in (out, want_out))
    assert np.abs(got - want).max() <= OUT_TOLERANCE[name] * np.abs(want).max()
    np.testing.assert_allclose(np.asarray(new)[:, layer], np.asarray(want_rows), rtol=1e-5, atol=1e-5)
    others = [i for i in range(L) if i != layer]
    np.testing.assert_array_equal(np.asarray(new)[:, others], before[:, others])
    np.testing.assert_array_equal(np.asarray(got_first), np.asarray(want_first))


@pytest.mark.parametrize("state", ["bfloat16", "float16"])
def test_a_16_bit_state_is_rounded_once(state):
    rng = np.random.default_rng()
    B, L, H, N = int(rng.integers(1, 5)), 2, 2, 64
    S = jnp.asarray(rng.standard_normal((B, L, H, N, N)), DTYPES[state])
    skip_unless_taken(S, jnp.float32)
    products, vecs, r_k, v_first = inputs(rng, B, H, N, first=False)
    out, new, _ = jax.jit(native.time_mix_step, static_argnums=(11, 12))(*products, vecs, r_k, v_first, S, 1, jnp.float32)
    want_out, want_rows, _ = reference(products, vecs, r_k, v_first, S[:, 1], jnp.float32)
    assert new.dtype == S.dtype
    got, want = (np.asarray(x.astype(jnp.float32)) for x in (new[:, 1], want_rows.astype(S.dtype)))
    assert np.mean(got == want) > 0.99  # nearly every value the same rounding of the same float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(new.astype(jnp.float32))[:, 0], np.asarray(S.astype(jnp.float32))[:, 0])


def test_a_donated_leaf_is_stepped_in_place():
    rng = np.random.default_rng()
    products, vecs, r_k, _ = inputs(rng, 2, 2, 64, first=True)
    S = jnp.asarray(rng.standard_normal((2, 2, 2, 64, 64)), jnp.float32)

    def two_layers(products, S):
        out0, S, v_first = native.time_mix_step(*products, vecs, r_k, None, S, 0, jnp.float32)
        out1, S, _ = native.time_mix_step(*products, vecs, r_k, v_first, S, 1, jnp.float32)
        return out0 + out1, S

    compiled = jax.jit(two_layers, donate_argnums=1).lower(products, S).compile()
    entry = compiled.as_text()[compiled.as_text().index("\nENTRY"):]
    assert entry.count("custom-call(") == 2 and " copy(" not in entry


def test_other_head_sizes_and_dtypes_are_not_taken():
    assert native.time_mix_supports(jnp.zeros((1, 1, 1, 32, 32), jnp.float32), jnp.bfloat16)
    assert not native.time_mix_supports(jnp.zeros((1, 1, 1, 48, 48), jnp.float32), jnp.float32)
    assert not native.time_mix_supports(jnp.zeros((1, 1, 1, 64, 64), jnp.float32), jnp.int32)
