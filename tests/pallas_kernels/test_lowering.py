"""Every Pallas kernel compiles for an H200 on this CPU-only machine (a deviceless XLA:GPU
compile: Triton lowering, PTX, ptxas), for each supported dtype and every default decode
bucket; ptxas (sm_90a) finds no register spill and the shared memory fits the H200's opt-in
limit. All the cases of one kernel and dtype go into one compile (one executable, many
kernels). A kernel that cannot compile, spills or overflows shared memory fails here."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import rwkv_jax
from pallas_kernels import shift_mix, small_m_linear, sparse_channel_mix, wkv_seq, wkv_step
from rwkv7_core.config import named_config
from rwkv_jax import deviceless
from rwkv_jax.modules import RWKV7
from rwkv_jax.pallas_ops import SPARSE_MAX_ROWS
from scheduler.config import bucket_ladder
from tests.gpu_target import H200, PLUGIN_DIR

DECODE_BUCKETS = bucket_ladder(256)              # (1, 2, 4, ..., 256)
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
C, H, N, F, V = 2560, 40, 64, 10240, 65536       # 2.9b-shape sizes
SD = jax.ShapeDtypeStruct
TRITON_CALL = "__gpu$xla.gpu.triton"


def lower_for_cuda(fn, *structs) -> str:
    """StableHLO text of fn lowered for CUDA; asserts a Pallas Triton kernel is in it. The
    opt-in pallas-fused kernels (issue 15) are only cross-lowered here, not compiled with the
    no-spill check: their `lora_up` still spills a few bytes at M > 1 in bf16."""
    text = jax.jit(fn).trace(*structs).lower(lowering_platforms=("cuda",)).as_text()
    assert TRITON_CALL in text, "no Pallas Triton kernel in the lowered module"
    return text


def compile_cases(cases) -> deviceless.StepReport:
    """cases: [(fn, arg structs)] compiled as one program; asserts every case launched a
    Pallas kernel and that no kernel spills or exceeds the opt-in shared memory."""
    def program(*arg_lists):
        return [fn(*args) for (fn, _), args in zip(cases, arg_lists)]

    report = deviceless.compile_function(program, tuple(args for _, args in cases), H200, plugin_dir=PLUGIN_DIR,
                                         entry_prefix="rwkv7")
    pallas = [k for k in report.kernels if k.name.startswith("rwkv7")]
    assert sum(k.launches for k in pallas) >= len(cases), report.launch_counts("rwkv7")
    assert report.ptxas_error is None, report.ptxas_error
    assert all(k.registers for k in pallas), [k for k in pallas if not k.registers]
    assert deviceless.resource_problems(report, H200, no_spill=True) == []
    return report


def test_wkv_kernels_compile_for_every_decode_bucket():
    f32 = jnp.float32
    cases = [(wkv_step.wkv_step, [SD((B, H, N), f32)] * 6 + [SD((B, H, N, N), f32)]) for B in DECODE_BUCKETS]
    cases += [(wkv_seq.wkv_seq, [SD((B, T, H, N), f32)] * 6 + [SD((B, H, N, N), f32)])
              for B, T in ((1, 1024), (3, 17))]
    report = compile_cases(cases)
    assert report.launch_counts("rwkv7") == {"rwkv7_wkv_step": len(DECODE_BUCKETS), "rwkv7_wkv_seq": 2}
    steps = [t for t in report.launches if deviceless.base_name(t.name) == "rwkv7_wkv_step"]
    assert {t.grid for t in steps} == {(B, H, 1) for B in DECODE_BUCKETS}  # one program per (sequence, head)
    assert {t.threads for t in steps} == {(128, 1, 1)}


def _no_delta(h, s, w, b, m):
    return shift_mix.shift_mix(h, None, s, w, b, m)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_mix_compiles_for_every_decode_bucket(dtype):
    vec = SD((C,), jnp.float32)
    cases = []
    for B in DECODE_BUCKETS:
        rows = SD((B, C), dtype)
        cases += [(shift_mix.shift_mix, [rows, rows, rows, vec, vec, SD((6, C), dtype)]),
                  (shift_mix.shift_mix, [rows, rows, rows, vec, vec, SD((1, C), dtype)]),
                  (_no_delta, [rows, rows, vec, vec, SD((6, C), dtype)])]
    compile_cases(cases)


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_m_products_compile_for_small_buckets(dtype):
    """Every decode bucket the small-M product serves (M <= MAX_M), at the 2.9b products'
    shapes (float32 included: its K tile is capped so that it does not spill)."""
    cases = [(small_m_linear.small_m_linear, [SD((M, K), dtype), SD((Nout, K), dtype)])
             for M in DECODE_BUCKETS if M <= small_m_linear.MAX_M
             for Nout, K in ((C, C), (F, C), (C, F), (V, C), (96, C), (C, 96))]
    cases += [(sparse_channel_mix.sparse_channel_mix, [SD((M, C), dtype), SD((F, C), dtype), SD((F, C), dtype)])
              for M in DECODE_BUCKETS if M <= SPARSE_MAX_ROWS]
    compile_cases(cases)


def test_float32_small_m_tiles_stay_narrow():
    """The float32 M > 1 product (an exact FMA dot) uses 64-wide K tiles; M = 1 and 16-bit
    dtypes keep 256 (ptxas spilled 9 KB per thread at 256 in float32)."""
    assert small_m_linear.block_k_for(16, 2560, jnp.float32) == small_m_linear.MAX_BLOCK_K_F32_DOT == 64
    assert small_m_linear.block_k_for(1, 2560, jnp.float32) == 256
    assert small_m_linear.block_k_for(16, 2560, jnp.bfloat16) == 256


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_decode_kernels_lower_for_cuda(dtype):
    """The fused decode kernels at the 2.9b shape (LoRA widths 96, 96, 64, 320: not all powers
    of two) with the state read in place, every decode bucket in bf16, three in other dtypes."""
    from pallas_kernels import ffn_value, lora_up, segment_linear, wkv_tail
    from pallas_kernels.segment_linear import padded_rows
    L, widths = 32, (96, 96, 64, 320)
    n_total = 3 * C + sum(widths)
    offsets = [3 * C + sum(widths[:i]) for i in range(4)]
    buckets = DECODE_BUCKETS if dtype == jnp.bfloat16 else (1, 16, 256)
    f32 = jnp.float32
    for B in buckets:
        Mp = padded_rows(B)
        weights = [SD((C, C), dtype)] * 3 + [SD((d, C), dtype) for d in widths]
        lower_for_cuda(lambda xs, *w: segment_linear.segment_linear(xs, w, [0, 2, 3, 1, 4, 3, 5]),
                       SD((6, B, C), dtype), *weights)
        lower_for_cuda(lambda p, *u: lora_up.lora_up(p, u, offsets, "wavg", M=B, dtype=dtype),
                       SD((4, Mp, n_total), f32), *[SD((C, d), dtype) for d in widths])
        lower_for_cuda(lambda p, lo, vec, rk, vf, S: wkv_tail.wkv_tail(p, lo, vec, rk, vf, S, layer=5),
                       SD((4, Mp, n_total), f32), SD((4, Mp, C), dtype), SD((7, C), f32), SD((H, N), f32),
                       SD((B, C), f32), SD((B, L, H, N, N), f32))
        lower_for_cuda(lambda p, w: ffn_value.ffn_value(p, w, M=B, dtype=dtype),
                       SD((2, Mp, F), f32), SD((F, C), dtype))


def test_whole_model_lowers_for_cuda_with_fused_kernels():
    config = named_config("tiny")
    for B in (1, 8, 256):
        params = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(RWKV7(config, None, jnp.bfloat16))[1]))
        state = jax.eval_shape(lambda: rwkv_jax.init_state(config, B, jnp.bfloat16))
        fn = functools.partial(rwkv_jax.forward_fn, config=config, path=rwkv_jax.select_path(B, 1),
                               kernels="pallas-fused")
        text = lower_for_cuda(fn, params, SD((B, 1), jnp.int32), state)
        assert text.count(TRITON_CALL) >= 8 * config.n_layer
