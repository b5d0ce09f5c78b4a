"""Every Pallas kernel compiles for an H200 on this CPU-only machine (a deviceless XLA:GPU
compile: Triton lowering, PTX, ptxas), for each supported dtype and every default decode
bucket (the fused decode kernels of ``kernels="pallas-fused"``: at each row block their tiles
depend on); ptxas (sm_90a) finds no register spill and the shared memory fits the H200's opt-in
limit. All the cases of one kernel and dtype go into one compile (one executable, many
kernels). A kernel that cannot compile, spills or overflows shared memory fails here."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import rwkv_jax
from pallas_kernels import (
    fused_time_mix,
    quantized_channel_mix,
    radix_search,
    shift_mix,
    shift_mix_rows,
    small_m_linear,
    sparse_channel_mix,
    wkv_chunk_varlen,
    wkv_operands,
    wkv_output,
    wkv_seq,
    wkv_step,
)
from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.time_mix import TimeMixWeights
from rwkv7_core.config import named_config
from rwkv_jax import deviceless
from rwkv_jax.modules import RWKV7
from rwkv_jax.pallas_ops import SPARSE_MAX_ROWS
from scheduler.config import bucket_ladder
from tests.gpu_target import H200, PLUGIN_DIR, assert_pallas_resources_reported

DECODE_BUCKETS = bucket_ladder(256)              # (1, 2, 4, ..., 256)
FUSED_BUCKETS = (1, 8, 32, 256)                  # each row block of the fused kernels (1, 16, 32, 64)
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
C, H, N, F, V = 2560, 40, 64, 10240, 65536       # 2.9b-shape sizes
SD = jax.ShapeDtypeStruct


def compile_cases(cases) -> deviceless.StepReport:
    """cases: [(fn, arg structs)] compiled as one program; asserts every case launched a
    Pallas kernel and that no kernel spills or exceeds the opt-in shared memory."""
    def program(*arg_lists):
        return [fn(*args) for (fn, _), args in zip(cases, arg_lists)]

    report = deviceless.compile_function(program, tuple(args for _, args in cases), H200, plugin_dir=PLUGIN_DIR,
                                         entry_prefix="rwkv7")
    pallas = [k for k in report.kernels if k.name.startswith("rwkv7")]
    assert sum(k.launches for k in pallas) >= len(cases), report.launch_counts("rwkv7")
    assert_pallas_resources_reported(report)
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


def test_chunked_varlen_kernel_compiles_without_spills():
    """A varlen batch of 64 sequences in 4,096 flat tokens (value blocks of 32 rows) and one
    sequence of 1,024 (blocks of 16 rows: four programs per head); one launch each."""
    f32 = jnp.float32
    cases = [(wkv_chunk_varlen.wkv_chunk_varlen,
              [SD((T, H, N), f32)] * 6 + [SD((P, H, N, N), f32), SD((P + 1,), jnp.int32)])
             for T, P in ((4096, 64), (1024, 1))]
    report = compile_cases(cases)
    assert report.launch_counts("rwkv7") == {"rwkv7_wkv_chunk_varlen": 2}
    grids = {t.grid for t in report.launches if t.name.startswith("rwkv7")}
    assert grids == {(64, H, N // 32), (1, H, N // 16)}


def test_prefill_row_kernels_compile_in_place_without_spills():
    """The prefill layer's Pallas kernels on whole [P, L, ...] state leaves (``RowsState``): the
    shift-mix rows (6 and 1 mixes, 2.9b width, bf16), the chunked kernel updating layer 3 of
    the wkv leaf in place, the wkv operands (a later and the first layer) and the output; one
    launch each, no spill."""
    bf16, f32, T, P, L = jnp.bfloat16, jnp.float32, 4096, 64, 4
    rows = [SD((T, C), bf16), SD((T, C), bf16), SD((P, L, C), bf16), SD((C,), f32), SD((C,), f32)]
    links = SD((2, T), jnp.int32)
    cases = [(functools.partial(shift_mix_rows.shift_mix_rows, layer=3), rows + [SD((n, C), bf16), links])
             for n in (6, 1)]
    cases.append((functools.partial(wkv_chunk_varlen.wkv_chunk_varlen, layer=3),
                  [SD((T, H, N), f32)] * 6 + [SD((P, L, H, N, N), f32), SD((P + 1,), jnp.int32)]))
    products, vecs = [SD((T, C), bf16)] * 6, SD((7, C), f32)
    cases += [(_operands, products + [vecs, SD((T, C), f32)]), (_operands, products[:5] + [None, vecs, None]),
              (functools.partial(wkv_output.wkv_output, dtype=bf16),
               [SD((T, H, N), f32)] + [SD((T, C), f32)] * 3 + [SD((T, C), bf16), vecs, SD((H, N), f32)])]
    report = compile_cases(cases)
    assert report.launch_counts("rwkv7") == {"rwkv7_shift_mix_rows": 2, "rwkv7_wkv_chunk_varlen": 1,
                                             "rwkv7_wkv_operands": 2, "rwkv7_wkv_output": 1}
    # the only copy is of the whole wkv leaf, which this program does not donate (the engine does)
    assert [c.shape for c in report.copies] == [f"f32[{P},{L},{H},{N},{N}]"]


def _operands(*products):
    """The six wkv operands (v_first, an input or a repeat of v, left out: no copy to a result)."""
    return wkv_operands.wkv_operands(*products, n_head=H)[:6]


def _no_delta(h, s, w, b, m):
    return shift_mix.shift_mix(h, None, s, w, b, m)


def _in_place(h, d, s, w, b, m):
    return shift_mix.shift_mix(h, d, s, w, b, m, layer=5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shift_mix_compiles_for_every_decode_bucket(dtype):
    """At the 2.9b width, and in place on a [B, L, C] leaf at the 1.5b one (C = 2048)."""
    vec, vec15 = SD((C,), jnp.float32), SD((2048,), jnp.float32)
    cases = []
    for B in DECODE_BUCKETS:
        rows = SD((B, C), dtype)
        cases += [(shift_mix.shift_mix, [rows, rows, rows, vec, vec, SD((6, C), dtype)]),
                  (shift_mix.shift_mix, [rows, rows, rows, vec, vec, SD((1, C), dtype)]),
                  (_no_delta, [rows, rows, vec, vec, SD((6, C), dtype)])]
        rows, leaf = SD((B, 2048), dtype), SD((B, 24, 2048), dtype)
        cases += [(_in_place, [rows, rows, leaf, vec15, vec15, SD((6, 2048), dtype)]),
                  (_in_place, [rows, None, leaf, vec15, vec15, SD((6, 2048), dtype)])]
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


def test_radix_search_compiles_for_decode_buckets():
    """The sampler's threshold passes (count and mass) at B = 1 and 256 over a 65,536 vocabulary:
    9 launches a search, one program per row and block of keys."""
    keys, weights, limit = SD((1, V), jnp.int32), SD((1, V), jnp.float32), SD((1,), jnp.float32)
    big = [SD((256,) + s.shape[1:], s.dtype) for s in (keys, weights, limit)]
    cases = [(functools.partial(radix_search.smallest_key, mass=mass), [k, w if mass else None, lim])
             for mass in (False, True) for k, w, lim in ((keys, weights, limit), big)]
    report = compile_cases(cases)
    assert report.launch_counts("rwkv7") == {"rwkv7_radix_pass": 32, "rwkv7_radix_finish": 4}
    assert {t.grid for t in report.launches if t.name.startswith("rwkv7_radix_pass")} == {(1, 32, 1), (256, 32, 1)}


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
    """The Triton lowering does not bound-check blocks: only shift_mix and shift_mix_rows (whose
    loads and stores are masked) may use a block wider than its array, here C=192 in 256-wide
    blocks."""
    f32 = jnp.float32
    odd = [jnp.zeros(s, f32) for s in ((3, 3, 64),) * 6] + [jnp.zeros((3, 3, 64, 64), f32)]
    assert _blocked_dims_not_tiling(wkv_step.wkv_step, *odd) == []
    seq = [jnp.zeros((3, 19, 3, 64), f32)] * 6 + [jnp.zeros((3, 3, 64, 64), f32)]
    assert _blocked_dims_not_tiling(wkv_seq.wkv_seq, *seq) == []
    assert _blocked_dims_not_tiling(small_m_linear.small_m_linear, jnp.zeros((3, 192)), jnp.zeros((96, 192))) == []
    assert _blocked_dims_not_tiling(functools.partial(radix_search.smallest_key, mass=True),
                                    jnp.zeros((3, 8192), jnp.int32), jnp.zeros((3, 8192)), jnp.zeros(3)) == []
    assert _blocked_dims_not_tiling(sparse_channel_mix.sparse_channel_mix, jnp.zeros((3, 192)),
                                    jnp.zeros((768, 192)), jnp.zeros((768, 192))) == []
    rows = jnp.zeros((5, 192))  # 3 heads; the row kernels' blocks are whole columns of heads
    vecs = jnp.zeros((7, 192))
    assert _blocked_dims_not_tiling(functools.partial(wkv_operands.wkv_operands, n_head=3), *[rows] * 6, vecs, rows) == []
    assert _blocked_dims_not_tiling(functools.partial(wkv_output.wkv_output, dtype=f32), jnp.zeros((5, 3, 64)),
                                    *[rows] * 4, vecs, jnp.zeros((3, 64))) == []
    assert _blocked_dims_not_tiling(shift_mix.shift_mix, rows, rows, rows, jnp.zeros(192), jnp.zeros(192),
                                    jnp.zeros((6, 192))) != []
    links = shift_mix_rows.dense_links(1, 5)
    assert _blocked_dims_not_tiling(shift_mix_rows.shift_mix_rows, rows, rows, rows[:1], jnp.zeros(192),
                                    jnp.zeros(192), jnp.zeros((6, 192)), jnp.asarray(links)) != []


def _fused_layer(h, mixed, wts, S, v_first, shift_c, shift_t, ln, mix_c, mix_t, w_key, w_val_t):
    """One fused decode layer (not the first: four LoRA pairs) and the next layer's mixes, as
    kernels="pallas-fused" chains them (the state leaves [B, L, ...] updated in place)."""
    out, S, v_first = fused_time_mix.fused_time_mix(mixed, wts, S, v_first, first=False, layer=5)
    h, xk, shift_c = shift_mix.shift_mix(h, out, shift_c, ln[0], ln[1], mix_c, layer=5)
    ffn = fused_time_mix.fused_channel_mix(xk[0], w_key, w_val_t, skip=xk.shape[1] <= SPARSE_MAX_ROWS)
    h, mixed, shift_t = shift_mix.shift_mix(h, ffn, shift_t, ln[2], ln[3], mix_t, layer=6)
    return h, mixed, S, v_first, shift_c, shift_t


@pytest.mark.parametrize("dtype", [jnp.bfloat16, pytest.param(jnp.float16, marks=pytest.mark.single_stack)])
def test_fused_decode_kernels_compile(dtype):
    """The eight fused decode kernels at the 2.9b shape (LoRA widths 96, 96, 64, 320: not all
    powers of two) at B = 1, 8, 32, 256 (lora_up's row blocks of 1, 16, 32, 64), state read in
    place; B = 1 with the value product skipping zero units, as pallas_ops runs it."""
    L, f32 = 32, jnp.float32
    wts = TimeMixWeights(
        *[SD((C, C), dtype)] * 4, *[s for d in (96, 96, 64, 320) for s in (SD((d, C), dtype), SD((C, d), dtype))],
        SD((7, C), f32), SD((H, N), f32))
    cases = [(_fused_layer, [SD((B, C), dtype), SD((6, B, C), dtype), wts, SD((B, L, H, N, N), f32), SD((B, C), f32),
                             SD((B, L, C), dtype), SD((B, L, C), dtype), SD((4, C), f32), SD((1, C), dtype),
                             SD((6, C), dtype), SD((F, C), dtype), SD((F, C), dtype)]) for B in FUSED_BUCKETS]
    report = compile_cases(cases)
    per_layer = {"rwkv7_segment_linear": 3, "rwkv7_lora_up": 1, "rwkv7_wkv_tail": 1, "rwkv7_ffn_value": 1,
                 "rwkv7_shift_mix": 2}
    assert report.launch_counts("rwkv7") == {k: n * len(FUSED_BUCKETS) for k, n in per_layer.items()}


def _quantized(shape, dtype, group=None):
    """A QuantizedWeight struct [out, in] (group: input channels per scale, default the whole row;
    dtype uint8: packed int4, q [out, in / 2])."""
    q_shape = (shape[0], shape[1] // 2) if dtype == jnp.uint8 else shape
    return QuantizedWeight(SD(q_shape, dtype), SD((shape[0], shape[1] // (group or shape[1])), jnp.float32))


def test_quantized_decode_kernels_compile():
    """The quantized kernels (int8 groups of 128, fp8, int4 groups of 64) at the 2.9b shape: a
    fused decode layer (int8 B = 1, fp8 B = 32, int4 B = 1) and the unfused channel-mix (int8
    M = 16, fp8 M = 1, int4 M = 8), the masked
    (skipping) loads included: no spills (the 1.5b step's in benchmarks/quant_decode_kernels.py)."""
    L, f32, bf16 = 32, jnp.float32, jnp.bfloat16
    cases = []
    for dtype, group, B, M in ((jnp.int8, 128, 1, 16), (jnp.float8_e4m3fn, None, 32, 1), (jnp.uint8, 64, 1, 8)):
        wts = TimeMixWeights(*[_quantized((C, C), dtype, group)] * 4,
                             *[s for d in (96, 96, 64, 320) for s in (SD((d, C), bf16), SD((C, d), bf16))],
                             SD((7, C), f32), SD((H, N), f32))
        w_key, w_val = _quantized((F, C), dtype, group), _quantized((C, F), dtype, group)
        cases += [(_fused_layer, [SD((B, C), bf16), SD((6, B, C), bf16), wts, SD((B, L, H, N, N), f32),
                                  SD((B, C), f32), SD((B, L, C), bf16), SD((B, L, C), bf16), SD((4, C), f32),
                                  SD((1, C), bf16), SD((6, C), bf16), w_key, w_val]),
                  (quantized_channel_mix.quantized_channel_mix, [SD((M, C), bf16), w_key, w_val])]
    report = compile_cases(cases)
    assert report.launch_counts("rwkv7")["rwkv7_quantized_linear"] == 6


def test_whole_model_compiles_with_fused_kernels():
    """kernels="pallas-fused": 8 Pallas launches per layer (and a few around them)."""
    config = named_config("tiny")
    params = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(RWKV7(config, None, jnp.bfloat16))[1]))
    cases = []
    for B in (1, 8, 256):
        state = jax.eval_shape(lambda B=B: rwkv_jax.init_state(config, B, jnp.bfloat16))
        fn = functools.partial(rwkv_jax.forward_fn, config=config, path=rwkv_jax.select_path(B, 1),
                               kernels="pallas-fused")
        cases.append((fn, [params, SD((B, 1), jnp.int32), state]))
    report = compile_cases(cases)
    assert sum(report.launch_counts("rwkv7").values()) >= 3 * 8 * config.n_layer
