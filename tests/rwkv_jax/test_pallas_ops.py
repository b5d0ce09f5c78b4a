"""rwkv_jax.pallas_ops wires each path to the intended kernels (checked on the traced
program: which Pallas kernels each op calls), with XLA fallbacks where a kernel cannot serve."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.small_m_linear import MAX_M
from rwkv_jax.ops import XLA_OPS
from rwkv_jax.pallas_ops import SPARSE_MAX_ROWS, pallas_ops
from rwkv_jax.paths import Path
from rwkv_jax.varlen import segments_from_lengths

C, F, H, N = 128, 512, 2, 64


def kernels_called(fn, *args) -> list[str]:
    """Names of the Pallas kernels in fn's traced program, in call order."""
    eqns = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    return [e.params["name"] for e in eqns if e.primitive.name == "pallas_call"]


def _ffn(M):
    return jnp.zeros((M, C)), jnp.zeros((F, C)), jnp.zeros((F, C))


def test_b1t1_uses_split_k_mixes_wkv_step_and_sparse_channel_mix():
    ops = pallas_ops(Path.B1T1, interpret=True)
    assert kernels_called(ops.linear, jnp.zeros((1, C)), jnp.zeros((F, C))) == ["rwkv7_small_m_linear"]
    assert kernels_called(ops.channel_mix, *_ffn(1)) == ["rwkv7_small_m_linear", "rwkv7_sparse_value_product"]
    # the state in place: the mixes and the wkv step take their layer of the whole leaves
    from rwkv_jax.state_views import LayerSlice

    rows = jnp.zeros((1, C))
    assert kernels_called(lambda h, s: ops.shift_mix(h, h, LayerSlice(s, 1), jnp.zeros(C), jnp.zeros(C),
                                                     jnp.zeros((6, C)))[2].full,
                          rows, jnp.zeros((1, 3, C))) == ["rwkv7_shift_mix"]
    vec = jnp.zeros((1, H, N))
    assert kernels_called(lambda *a: ops.wkv_step(*a[:6], LayerSlice(a[6], 2))[1].full,
                          *[vec] * 6, jnp.zeros((1, 3, H, N, N))) == ["rwkv7_wkv_step"]
    assert kernels_called(ops.wkv_step, *[vec] * 6, jnp.zeros((1, H, N, N))) == ["rwkv7_wkv_step"]  # plain rows


def test_batched_decode_switches_from_sparse_to_small_m_to_xla_with_rows():
    ops = pallas_ops(Path.BATCHED_DECODE, interpret=True)
    assert kernels_called(ops.channel_mix, *_ffn(SPARSE_MAX_ROWS)) == [
        "rwkv7_small_m_linear", "rwkv7_sparse_value_product"]
    # past SPARSE_MAX_ROWS the same row-walking product runs dense (skip off)
    assert kernels_called(ops.channel_mix, *_ffn(SPARSE_MAX_ROWS + 1)) == [
        "rwkv7_small_m_linear", "rwkv7_sparse_value_product"]
    assert kernels_called(ops.channel_mix, *_ffn(MAX_M + 1)) == []
    assert kernels_called(ops.linear, jnp.zeros((MAX_M, C)), jnp.zeros((C, C))) == ["rwkv7_small_m_linear"]
    assert kernels_called(ops.linear, jnp.zeros((MAX_M + 1, C)), jnp.zeros((C, C))) == []


def test_unsupported_shapes_fall_back_to_xla():
    ops = pallas_ops(Path.B1T1, interpret=True)
    assert kernels_called(ops.linear, jnp.zeros((1, C)), jnp.zeros((300, C))) == []  # N=300: no 16-block
    assert kernels_called(ops.linear, jnp.zeros((1, 24)), jnp.zeros((C, 24))) == []   # K=24


def test_dense_uses_the_sequence_kernel_and_xla_products():
    ops = pallas_ops(Path.DENSE, interpret=True)
    seq = jnp.zeros((2, 5, H, N))
    assert kernels_called(ops.wkv_seq, *[seq] * 6, jnp.zeros((2, H, N, N))) == ["rwkv7_wkv_seq"]
    long = jnp.zeros((2, 17, H, N))  # past one chunk: the chunked kernel
    assert kernels_called(ops.wkv_seq, *[long] * 6, jnp.zeros((2, H, N, N))) == ["rwkv7_wkv_chunk_varlen"]
    flat, segs = jnp.zeros((9, H, N)), segments_from_lengths([1, 0, 8])
    assert kernels_called(ops.wkv_varlen, *[flat] * 6, jnp.zeros((3, H, N, N)), segs) == ["rwkv7_wkv_chunk_varlen"]
    assert XLA_OPS.wkv_varlen is not ops.wkv_varlen
    assert ops.linear is XLA_OPS.linear and ops.channel_mix is XLA_OPS.channel_mix


def test_pallas_ops_rejects_a_non_path():
    with pytest.raises(ValueError, match="rwkv_jax.Path"):
        pallas_ops("b1t1", interpret=True)


def test_fused_decode_ops_launch_the_fused_kernels_on_whole_state_leaves():
    from pallas_kernels.segment_linear import SplitSum
    from pallas_kernels.time_mix import TimeMixWeights
    from rwkv_jax.pallas_ops import fused_ops
    from rwkv_jax.state_views import InPlaceState, LayerSlice
    d = 32
    z = jnp.zeros
    wts = TimeMixWeights(z((C, C)), z((C, C)), z((C, C)), z((C, C)), z((d, C)), z((C, d)), z((d, C)),
                         z((C, d)), z((d, C)), z((C, d)), z((d, C)), z((C, d)), z((7, C)), z((C // N, N)))
    for path in (Path.B1T1, Path.BATCHED_DECODE):
        ops = fused_ops(path, interpret=True)
        assert ops.state_views is InPlaceState
        M = 1 if path is Path.B1T1 else 3
        S = LayerSlice(z((M, 4, C // N, N, N)), 2)
        for first in (True, False):
            v_first = None if first else z((M, C))
            def time_mix(m, s):
                out, S_new, _ = ops.time_mix(m, wts, LayerSlice(s, 2), v_first, first=first, wkv=None)  # noqa: B023 - called in this iteration
                return out.partials, S_new.full

            assert kernels_called(time_mix, z((6, M, C)), S.full) == [
                "rwkv7_segment_linear", "rwkv7_lora_up", "rwkv7_wkv_tail", "rwkv7_segment_linear"]
        assert kernels_called(lambda *a: ops.channel_mix(*a).partials, *_ffn(M)) == [  # noqa: B023 - called in this iteration
            "rwkv7_segment_linear", "rwkv7_ffn_value"]
        assert isinstance(ops.channel_mix(*_ffn(M)), SplitSum)
        shift = z((M, 4, C))
        assert kernels_called(lambda h, s: ops.shift_mix(h, None, LayerSlice(s, 1), z(C), z(C), z((6, C)))[2].full,  # noqa: B023 - called in this iteration
                              z((M, C)), shift) == ["rwkv7_shift_mix"]
    from rwkv_jax.state_views import RowsState
    assert fused_ops(Path.DENSE, interpret=True).state_views is RowsState  # prefill rows: see below


def test_prefill_ops_update_the_wkv_leaf_in_place_and_read_shift_rows_from_the_leaf():
    from rwkv_jax.state_views import LayerSlice
    ops = pallas_ops(Path.DENSE, interpret=True)
    T = 20
    rng = np.random.default_rng(3)
    xs = [jnp.asarray(rng.standard_normal((1, T, H, N)) * 0.1, jnp.float32) for _ in range(6)]
    xs[1] = jnp.exp(-jnp.exp(xs[1] - 1.0))  # decays in (0, 1)
    leaf = jnp.asarray(rng.standard_normal((1, 3, H, N, N)), jnp.float32)
    y, S = ops.wkv_seq(*xs, LayerSlice(leaf, 1))
    y_rows, rows = ops.wkv_seq(*xs, leaf[:, 1])
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_rows))
    np.testing.assert_array_equal(np.asarray(S.full[:, 1]), np.asarray(rows))
    np.testing.assert_array_equal(np.asarray(S.full[:, [0, 2]]), np.asarray(leaf[:, [0, 2]]))
    assert kernels_called(lambda *a: ops.wkv_seq(*a[:6], LayerSlice(a[6], 1))[1].full, *xs, leaf) == [
        "rwkv7_wkv_chunk_varlen"]  # no slice or update of the leaf around the kernel

