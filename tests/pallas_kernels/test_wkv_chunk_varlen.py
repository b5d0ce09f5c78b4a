"""The chunked varlen wkv kernel (interpret mode) against its naive per-token reference, on
random lengths (0, 1, one chunk, not a multiple of the chunk, several chunks), padding past
the last sequence, streams shorter than one chunk (float32, the kernel's only dtype: the wkv
operands are float32 in every model dtype); and the whole model's varlen forward with
kernels="pallas-interpret" against "xla" in bfloat16."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rwkv_jax
from pallas_kernels import wkv_chunk_varlen as chunk
from rwkv_jax.forward import varlen_forward_fn
from rwkv_jax.varlen import segments_from_lengths
from tests.support.pallas_inputs import varlen_wkv_inputs

T, P = 80, 6   # one compiled shape for every case (the interpreter compiles once)
KERNEL = jax.jit(functools.partial(chunk.wkv_chunk_varlen, interpret=True))
REFERENCE = jax.jit(chunk.wkv_varlen_reference)


def _case(seed: int, lengths, n_tokens: int = T, H: int = 2):
    """(operands over n_tokens flat tokens, S [P, H, N, N], cu_seqlens [P + 1]); lengths padded
    with empty sequences to P."""
    *xs, S, cu = varlen_wkv_inputs(seed, list(lengths) + [0] * (P - len(lengths)), H, pad=n_tokens - sum(lengths))
    return xs, S, cu


def _random_lengths(seed: int):
    """Up to P lengths from {0, 1, 3, CHUNK, 23, 40} fitting in T - 1 tokens (1+ padding row)."""
    rng = np.random.default_rng(seed)
    lengths = []
    for n in rng.choice([0, 1, 3, chunk.CHUNK, 23, 40], size=P).tolist():
        if sum(lengths) + n < T:
            lengths.append(n)
    return lengths


@pytest.mark.parametrize("lengths", [_random_lengths(0), _random_lengths(1), [40, 1, 0, 35], [0, 0]])
def test_chunked_kernel_matches_the_per_token_reference(lengths):
    xs, S, cu = _case(sum(lengths), lengths)
    y, S_new = KERNEL(*xs, S, cu)
    y_ref, S_ref = REFERENCE(*xs, S, cu)
    assert np.isfinite(np.asarray(y)).all() and np.isfinite(np.asarray(S_new)).all()
    scale = float(np.abs(np.asarray(y_ref)).max())
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), atol=2e-6 * scale + 1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(S_new), np.asarray(S_ref), atol=1e-5, rtol=0)
    assert not np.asarray(y[sum(lengths):]).any()  # padding rows stay zero
    for p in range(P):  # an empty sequence keeps its state row
        if p >= len(lengths) or lengths[p] == 0:
            np.testing.assert_array_equal(np.asarray(S_new[p]), np.asarray(S[p]))


def test_a_stream_shorter_than_one_chunk():
    xs, S, cu = _case(5, [3, 1, 0, 4], n_tokens=9)
    (y, S_new), (y_ref, S_ref) = chunk.wkv_chunk_varlen(*xs, S, cu, interpret=True), REFERENCE(*xs, S, cu)
    assert y.shape == y_ref.shape
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(S_new), np.asarray(S_ref), atol=1e-5, rtol=0)


def test_value_rows_split_until_the_grid_fills_the_gpu():
    assert chunk.value_block(64, 32, 64) == 32            # 4,096 programs: the largest block
    assert chunk.value_block(1, 32, 64) == 16             # one sequence: 128 programs
    assert 4 * 32 * (64 // chunk.value_block(4, 32, 64)) >= chunk.TARGET_PROGRAMS


def test_bad_cu_seqlens_is_named():
    xs, S, cu = _case(0, [2, 3], 0)
    with pytest.raises(ValueError, match="cu_seqlens must be int32"):
        chunk.wkv_chunk_varlen(*xs, S, cu[:-1], interpret=True)


def test_varlen_model_forward_equals_xla_in_bfloat16(tiny_ckpt):
    """FlatRows on the Pallas path (the chunked kernel) vs the XLA per-token loop: logits and
    every state row, decode rows (n_single) ahead of prompt pieces as in a mixed step (float32
    dense parity through the chunked kernel: tests/rwkv_jax/test_pallas_model.py, T=17)."""
    dtype, atol = "bfloat16", 0.05
    xla = rwkv_jax.load(tiny_ckpt, dtype=dtype, kernels="xla")
    pallas = rwkv_jax.load(tiny_ckpt, dtype=dtype, kernels="pallas-interpret")
    lengths = [1, 1, 0, 35, 16, 2]
    rng = np.random.default_rng(4)
    tokens = np.zeros(sum(lengths) + 3, np.int32)
    tokens[:sum(lengths)] = rng.integers(0, xla.config.vocab_size, sum(lengths))
    segs = segments_from_lengths(lengths)
    state = xla.init_state(len(lengths))
    state = type(state)(*(leaf + 0.1 * jax.random.normal(jax.random.key(i), leaf.shape, leaf.dtype)
                          for i, leaf in enumerate(state)))
    fn = jax.jit(varlen_forward_fn, static_argnames=("config", "kernels", "n_single"))
    (lx, sx), (lp, sp) = (fn(m.params, jnp.asarray(tokens), state, segs.starts, segs.lengths,
                              config=m.config, kernels=kind, n_single=2)
                           for m, kind in ((xla, "xla"), (pallas, "pallas-interpret")))
    live = np.asarray(lengths) > 0
    np.testing.assert_allclose(np.asarray(lp, np.float32)[live], np.asarray(lx, np.float32)[live], atol=atol, rtol=0)
    for name, leaf_p, leaf_x in zip(sx._fields, sp, sx):
        np.testing.assert_allclose(np.asarray(leaf_p, np.float32), np.asarray(leaf_x, np.float32),
                                   atol=atol, rtol=0, err_msg=f"state.{name}")
