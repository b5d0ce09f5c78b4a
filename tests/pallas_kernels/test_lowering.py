"""Every Pallas kernel lowers for CUDA from this CPU-only machine (Triton lowering), for each
supported dtype and the default decode bucket sizes; so does the whole model with
kernels="pallas" on each path. A kernel that cannot lower fails here."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import rwkv_jax
from pallas_kernels import shift_mix, small_m_linear, sparse_channel_mix, wkv_seq, wkv_step
from rwkv_jax.modules import RWKV7
from rwkv_jax.pallas_ops import SPARSE_MAX_ROWS
from rwkv7_core import named_config
from scheduler.config import bucket_ladder

DECODE_BUCKETS = bucket_ladder(256)              # (1, 2, 4, ..., 256)
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
TRITON_CALL = "__gpu$xla.gpu.triton"
C, H, N, F, V = 2560, 40, 64, 10240, 65536       # 2.9b-shape sizes
SD = jax.ShapeDtypeStruct


def lower_for_cuda(fn, *structs) -> str:
    """StableHLO text of fn lowered for CUDA; asserts a Pallas Triton kernel is in it."""
    text = jax.jit(fn).trace(*structs).lower(lowering_platforms=("cuda",)).as_text()
    assert TRITON_CALL in text, "no Pallas Triton kernel in the lowered module"
    return text


def test_wkv_kernels_lower_for_every_decode_bucket():
    for B in DECODE_BUCKETS:
        lower_for_cuda(wkv_step.wkv_step, *[SD((B, H, N), jnp.float32)] * 6, SD((B, H, N, N), jnp.float32))
    for B, T in ((1, 1024), (3, 17)):
        lower_for_cuda(wkv_seq.wkv_seq, *[SD((B, T, H, N), jnp.float32)] * 6, SD((B, H, N, N), jnp.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_mix_lowers_for_every_decode_bucket(dtype):
    for B in DECODE_BUCKETS:
        for n, with_delta in ((6, True), (1, True), (6, False)):
            rows = SD((B, C), dtype)
            fn = shift_mix.shift_mix if with_delta else (
                lambda h, s, w, b, m: shift_mix.shift_mix(h, None, s, w, b, m))
            args = [rows, rows, rows] if with_delta else [rows, rows]
            lower_for_cuda(fn, *args, SD((C,), jnp.float32), SD((C,), jnp.float32), SD((n, C), dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_m_products_lower_for_small_buckets(dtype):
    for M in (b for b in DECODE_BUCKETS if b <= small_m_linear.MAX_M):
        for Nout, K in ((C, C), (F, C), (C, F), (V, C), (96, C), (C, 96)):
            lower_for_cuda(small_m_linear.small_m_linear, SD((M, K), dtype), SD((Nout, K), dtype))
    for M in (b for b in DECODE_BUCKETS if b <= SPARSE_MAX_ROWS):
        lower_for_cuda(sparse_channel_mix.sparse_channel_mix, SD((M, C), dtype), SD((F, C), dtype),
                       SD((F, C), dtype))


@pytest.mark.parametrize("dtype,B,T", [(jnp.bfloat16, 1, 1), (jnp.bfloat16, 4, 1), (jnp.bfloat16, 2, 17),
                                       (jnp.float16, 1, 1), (jnp.float32, 16, 1)])
def test_whole_model_lowers_for_cuda_with_pallas_kernels(dtype, B, T):
    config = named_config("tiny")
    params = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(RWKV7(config, None, dtype))[1]))
    state = jax.eval_shape(lambda: rwkv_jax.init_state(config, B, dtype))
    fn = functools.partial(rwkv_jax.forward_fn, config=config, path=rwkv_jax.select_path(B, T),
                           kernels="pallas")
    text = lower_for_cuda(fn, params, SD((B, T), jnp.int32), state)
    assert text.count(TRITON_CALL) >= config.n_layer  # at least one kernel per layer


def _blocked_dims_not_tiling(fn, *args) -> list:
    """(block size, array size) pairs where a pallas_call's block does not tile its array."""
    bad = []
    for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
        if eqn.primitive.name != "pallas_call":
            continue
        for mapping in eqn.params["grid_mapping"].block_mappings:
            for block, size in zip(mapping.block_shape, mapping.array_aval.shape):
                block_size = getattr(block, "block_size", None)
                if type(block).__name__ == "Blocked" and size % block_size:
                    bad.append((block_size, size))
    return bad


def test_blocks_tile_arrays_exactly_except_in_the_masked_kernel():
    """The Triton lowering does not bound-check blocks: only shift_mix (whose loads and
    stores are masked) may use a block wider than its array, here C=192 in 256-wide blocks."""
    f32 = jnp.float32
    odd = [jnp.zeros(s, f32) for s in ((3, 3, 64),) * 6] + [jnp.zeros((3, 3, 64, 64), f32)]
    assert _blocked_dims_not_tiling(wkv_step.wkv_step, *odd) == []
    seq = [jnp.zeros((3, 19, 3, 64), f32)] * 6 + [jnp.zeros((3, 3, 64, 64), f32)]
    assert _blocked_dims_not_tiling(wkv_seq.wkv_seq, *seq) == []
    assert _blocked_dims_not_tiling(small_m_linear.small_m_linear, jnp.zeros((3, 192)), jnp.zeros((96, 192))) == []
    assert _blocked_dims_not_tiling(sparse_channel_mix.sparse_channel_mix, jnp.zeros((3, 192)),
                                    jnp.zeros((768, 192)), jnp.zeros((768, 192))) == []
    rows = jnp.zeros((5, 192))
    assert _blocked_dims_not_tiling(shift_mix.shift_mix, rows, rows, rows, jnp.zeros(192), jnp.zeros(192),
                                    jnp.zeros((6, 192))) != []
