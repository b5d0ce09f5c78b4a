"""The Mosaic GPU shift_mix in GPU interpret mode (race detection on, out-of-bounds reads raising)
against ``shift_mix_reference`` on fresh seeded inputs: C = 192 (a row padded to two warpgroup
vectors), 128 and 2048; no delta, a [B, C] delta and split-K partials with padded rows; one
row, several rows and the whole [B, L, C] shift leaf updated in place (the other layers
untouched); 32 split-K partials summed in groups through shared memory; float32 and
bfloat16; 6 mixes (time-mix) and 1 (channel-mix). Needs jax >= 0.11."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.segment_linear import SplitSum
from pallas_kernels.shift_mix import shift_mix_reference
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version

pytestmark = pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX,
                                reason="Mosaic GPU interpret mode needs jax >= 0.11")

if jax_version() >= MOSAIC_MIN_JAX:  # GPU interpret mode's modules exist from jax 0.11
    from pallas_kernels.mosaic import common as mosaic_common
    from pallas_kernels.mosaic import shift_mix as mosaic_shift_mix


def _inputs(seed: int, B: int, C: int, n: int, L: int | None, dtype):
    ks = iter(jax.random.split(jax.random.key(seed), 6))
    h = (jax.random.normal(next(ks), (B, C)) + 0.5).astype(dtype)
    shift = jax.random.normal(next(ks), (B, C) if L is None else (B, L, C)).astype(dtype)
    ln_w = (1 + 0.3 * jax.random.normal(next(ks), (C,))).astype(dtype)
    ln_b = (0.2 * jax.random.normal(next(ks), (C,))).astype(dtype)
    mix = jax.random.uniform(next(ks), (n, C)).astype(dtype)
    return h, shift, ln_w, ln_b, mix, next(ks)


@pytest.mark.parametrize("B,C,n,delta,L,dtype", [
    (2, 192, 6, "partials", 3, jnp.bfloat16),
    (1, 128, 1, None, None, jnp.float32),
    (3, 2048, 1, "rows", None, jnp.float32),
    (1, 192, 6, "rows", None, jnp.float32),
    (2, 2048, 6, "many splits", 2, jnp.bfloat16),
])
def test_mosaic_shift_mix_matches_reference(B, C, n, delta, L, dtype):
    mosaic_common.reset_interpreter()
    h, shift, ln_w, ln_b, mix, key = _inputs(B * 11 + C + n, B, C, n, L, dtype)
    layer = None if L is None else L - 2
    if delta in ("partials", "many splits"):  # over B + 2 padded rows (the padding is not read)
        # 3 splits fit shared memory at once; 32 at C = 2048 go through it in groups of 8
        given = jax.random.normal(key, (3 if delta == "partials" else 32, B + 2, C))
        wrap = lambda d: SplitSum(d, B, dtype)  # noqa: E731
        want_delta = wrap(given).total()
    else:
        given = None if delta is None else jax.random.normal(key, (B, C)).astype(dtype)
        wrap = lambda d: d  # noqa: E731
        want_delta = given
    rows = shift if L is None else shift[:, layer]
    want_h, want_mixed, want_x = shift_mix_reference(h, want_delta, rows, ln_w, ln_b, mix)
    run = jax.jit(lambda d, *a: mosaic_shift_mix.shift_mix(h, wrap(d), *a, layer=layer, interpret=True))
    got_h, got_mixed, got_shift = run(given, shift, ln_w, ln_b, mix)
    assert not mosaic_common.races_found()
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for got, want in ((got_h, want_h), (got_mixed, want_mixed),
                      (got_shift if L is None else got_shift[:, layer], want_x)):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol)
    if L is not None:  # the other layers of the whole leaf are untouched
        others = [i for i in range(L) if i != layer]
        np.testing.assert_array_equal(np.asarray(got_shift[:, others]), np.asarray(shift[:, others]))


def test_mosaic_shift_mix_rows_are_padded_to_warpgroup_vectors():
    assert [mosaic_shift_mix.padded(C) for C in (128, 192, 2048, 2560)] == [128, 256, 2048, 2560]


def test_mosaic_shift_mix_holds_as_many_splits_as_fit():
    assert mosaic_shift_mix.split_group(3, 2048) == 3 and mosaic_shift_mix.split_group(32, 2048) == 8
    assert mosaic_shift_mix.split_group(7, 2560) == 1


def test_mosaic_shift_mix_serves_rows_of_whole_tma_copies():
    """A row's TMA pieces (<= 256 elements) must each move a multiple of 128 bytes."""
    assert mosaic_shift_mix.supports(192, {2, 4}) and mosaic_shift_mix.supports(2560, {2})
    assert not mosaic_shift_mix.supports(200, {2}) and not mosaic_shift_mix.supports(2048 + 16, {4})


def test_mosaic_shift_mix_rejects_a_shift_of_another_dtype():
    h, shift, ln_w, ln_b, mix, _ = _inputs(0, 1, 128, 1, None, jnp.float32)
    with pytest.raises(ValueError, match="shift must be"):
        mosaic_shift_mix.shift_mix(h, None, shift.astype(jnp.bfloat16), ln_w, ln_b, mix, interpret=True)
