"""The Mosaic GPU wkv tail in GPU interpret mode (race detection on, out-of-bounds reads raising)
against ``wkv_tail_reference`` on fresh seeded inputs: first layer and later layers, one layer's
rows or one layer of the whole [B, L, H, N, N] state updated in place (the other layers
untouched), float32 and bfloat16, split-K partials in 1 to 3 splits, B = 1 to 32. Needs jax >= 0.11
(GPU interpret mode); skipped on older jax."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.wkv_tail import wkv_tail_reference
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version

pytestmark = pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX,
                                reason="Mosaic GPU interpret mode needs jax >= 0.11")

if jax_version() >= MOSAIC_MIN_JAX:  # GPU interpret mode's modules exist from jax 0.11
    from pallas_kernels.mosaic import common as mosaic_common
    from pallas_kernels.mosaic import wkv_tail as mosaic_wkv_tail

N = 64
EXTRA = 40  # LoRA down columns after r, k, v in the partials (not read by the tail)


def _inputs(seed: int, B: int, H: int, splits: int, first: bool, L: int | None, dtype):
    C = H * N
    ks = iter(jax.random.split(jax.random.key(seed), 8))
    partials = 0.3 * jax.random.normal(next(ks), (splits, B + 1, 3 * C + EXTRA))
    lora = (0.5 * jax.random.normal(next(ks), (3 if first else 4, B + 1, C))).astype(dtype)
    vecs = 0.5 * jax.random.normal(next(ks), (7, C))
    vecs = vecs.at[5].add(1.0)
    r_k = 0.5 * jax.random.normal(next(ks), (H, N))
    v_first = None if first else jax.random.normal(next(ks), (B, C))
    S = 0.2 * jax.random.normal(next(ks), (B, H, N, N) if L is None else (B, L, H, N, N))
    return partials, lora, vecs, r_k, v_first, S


def _reference(partials, lora, vecs, r_k, v_first, rows):
    B, C = rows.shape[0], lora.shape[2]
    r, k, v = (partials[:, :B, i * C:(i + 1) * C].sum(0).astype(lora.dtype) for i in range(3))
    ups = [lora[i, :B] for i in range(lora.shape[0])]
    w_l, a_l, g = ups[0], ups[1], ups[-1]
    v_l = None if v_first is None else ups[2]
    return wkv_tail_reference(r, k, v, w_l, a_l, v_l, g, vecs, r_k, v_first, rows)


def _close(got, want, atol):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=atol, rtol=atol)


@pytest.mark.parametrize("B,H,splits,first,L,dtype", [
    (1, 2, 1, True, None, jnp.float32),
    (2, 2, 3, False, 3, jnp.bfloat16),
    (8, 1, 2, False, None, jnp.float32),
    (32, 1, 1, True, 2, jnp.bfloat16),
])
def test_mosaic_wkv_tail_matches_reference(B, H, splits, first, L, dtype):
    mosaic_common.reset_interpreter()
    partials, lora, vecs, r_k, v_first, S = _inputs(B * 7 + H, B, H, splits, first, L, dtype)
    layer = None if L is None else L - 1
    rows = S if L is None else S[:, layer]
    want_out, want_S, want_vf = _reference(partials, lora, vecs, r_k, v_first, rows)
    run = jax.jit(lambda *a: mosaic_wkv_tail.wkv_tail(*a, layer=layer, interpret=True))
    out, new, vf = run(partials, lora, vecs, r_k, v_first, S)
    assert not mosaic_common.races_found()
    atol = 1e-4 if dtype == jnp.float32 else 3e-2
    _close(out, want_out, atol)
    _close(new if L is None else new[:, layer], want_S, 1e-4)
    _close(vf, want_vf, 1e-6)
    if L is not None:  # the other layers of the whole leaf are untouched
        np.testing.assert_array_equal(np.asarray(new[:, :layer]), np.asarray(S[:, :layer]))


def test_mosaic_wkv_tail_rejects_a_wrong_state():
    partials, lora, vecs, r_k, v_first, _ = _inputs(0, 1, 2, 1, False, None, jnp.float32)
    with pytest.raises(ValueError, match="S must be float32"):
        mosaic_wkv_tail.wkv_tail(partials, lora, vecs, r_k, v_first, jnp.zeros((1, 2, N, N), jnp.bfloat16),
                                 interpret=True)


def test_mosaic_wkv_tail_needs_whole_warpgroup_tiles():
    """A head size that does not tile the WGMMA layout is refused (mosaic_ops then takes the Triton tail)."""
    assert mosaic_wkv_tail.supports(64) and mosaic_wkv_tail.supports(128) and not mosaic_wkv_tail.supports(32)
    H, n32 = 2, 32
    with pytest.raises(ValueError, match="multiple of 64"):
        mosaic_wkv_tail.wkv_tail(jnp.zeros((1, 1, 3 * H * n32)), jnp.zeros((4, 1, H * n32)), jnp.zeros((7, H * n32)),
                                 jnp.zeros((H, n32)), jnp.zeros((1, H * n32)), jnp.zeros((1, H, n32, n32)),
                                 interpret=True)
