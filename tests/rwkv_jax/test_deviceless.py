"""The whole engine compiles for an H200 on this CPU-only machine (rwkv_jax.deviceless): the
decode step with sampling at B=1 and at the decode buckets where the Pallas path changes
kernels, prefill pieces and dense forwards at odd and even T, and the varlen / mixed
executables, with kernels="pallas" and "xla", for the tiny shape, an odd shape (C=192, three
heads, odd low-rank widths) and the 1.5b shape (shapes only). What the compile built is
checked too: the Pallas kernels a step launches per layer, no spill in a decode kernel,
shared memory under the opt-in limit, and no copy of the whole donated wkv state.

Compiles are slow (tens of seconds each on two cores), so the sweeps are marked
`single_stack`: CI runs them on the pinned stack (the whole suite) and a B=1 / 1.5b subset on the
GPU machine's stack.
`rwkv7-gpu-compile --buckets ...` compiles any other bucket on demand."""
from __future__ import annotations

import functools

import pytest

from pallas_kernels.wkv_chunk_varlen import CHUNK
from rwkv7_core import named_config
from rwkv7_core.state import state_shapes
from rwkv_jax import deviceless
from rwkv_jax.engine import JaxEngine
from rwkv_jax.executables import EXECUTABLES
from tests.gpu_target import H200, assert_pallas_resources_reported, engine
from tests.shapes import ODD_CONFIG

CONFIGS = {"tiny": named_config("tiny"), "odd": ODD_CONFIG, "1.5b": named_config("1.5b")}
# The Pallas decode path's edges (rwkv_jax.pallas_ops): B=1 is its own path, the sparse
# channel-mix serves up to SPARSE_MAX_ROWS=4 rows, the small-M products up to MAX_M=16, XLA
# dots above, up to the largest bucket. XLA's own path has no edges beyond B=1.
DECODE = {"pallas": ["1x1", "2x1", "4x1", "16x1", "32x1", "256x1"], "xla": ["1x1", "2x1", "256x1"]}
DENSE = {"pallas": ["1x17", "2x17", "3x33", "2x16", "1x64", "5x3"], "xla": ["2x17", "2x16"]}
SINGLE_STACK = pytest.mark.single_stack
SAMPLER_LAUNCHES = 28  # the straight-line sampler's launches a step (16 Pallas radix passes, 2 finishes, noise, draw: 26)


@functools.lru_cache(maxsize=None)
def _engine(shape: str, dtype: str, kernels: str):
    return engine(CONFIGS[shape], dtype, kernels)


def compile_ok(shape: str, kernels: str, label: str, dtype: str = "bfloat16", ptxas: bool = False):
    result = deviceless.compile_bucket(_engine(shape, dtype, kernels), deviceless.Bucket.parse(label), H200,
                                       ptxas=ptxas, entry_prefix="rwkv7")
    assert result.ok, result.error
    assert result.report.launches
    assert deviceless.resource_problems(result.report, H200, no_spill=True) == []
    if ptxas:
        assert_pallas_resources_reported(result.report)
    return result


def wkv_state_bytes(config, B: int) -> int:
    L, H, N = config.n_layer, config.n_head, config.head_size
    assert state_shapes(config, B)["wkv"] == (B, L, H, N, N)
    return B * L * H * N * N * 4


SHAPES_AND_KERNELS = [("tiny", "pallas"), ("odd", "pallas"), ("tiny", "xla")]  # odd shapes matter to kernels


@SINGLE_STACK
@pytest.mark.parametrize("shape, kernels", SHAPES_AND_KERNELS)
def test_decode_steps_compile_at_the_path_edges(shape, kernels):
    config = CONFIGS[shape]
    for label in DECODE[kernels]:
        result = compile_ok(shape, kernels, label, ptxas=kernels == "pallas")
        B = result.bucket.B
        if B > 1:  # the donated state is updated in place (B=1 copies single-layer slices)
            largest = max((c.bytes for c in result.report.copies), default=0)
            assert largest < wkv_state_bytes(config, B) / config.n_layer, result.report.summary()
        if kernels == "pallas":  # the GPU step samples in straight-line code
            summary = result.report.summary()
            assert summary["conditionals"] == summary["while_loops"] == 0, summary
            counts = result.report.launch_counts("rwkv7")
            assert counts["rwkv7_wkv_step"] == config.n_layer
            assert counts["rwkv7_shift_mix"] == 2 * config.n_layer
        else:
            assert result.report.launch_counts("rwkv7") == {}


@SINGLE_STACK
@pytest.mark.parametrize("shape, kernels", SHAPES_AND_KERNELS)
def test_dense_paths_compile_at_odd_and_even_T(shape, kernels):
    for label in DENSE[kernels]:
        result = compile_ok(shape, kernels, label)
        assert result.bucket.path == "DENSE"
        if kernels == "pallas":  # past one chunk the chunked kernel, else the per-token one; the
            kernel = "rwkv7_wkv_chunk_varlen" if result.bucket.T > CHUNK else "rwkv7_wkv_seq"  # two mixes' rows,
            # the wkv operands and the output
            n = CONFIGS[shape].n_layer
            assert result.report.launch_counts("rwkv7") == {kernel: n, "rwkv7_shift_mix_rows": 2 * n,
                                                     "rwkv7_wkv_operands": n, "rwkv7_wkv_output": n}


@pytest.mark.parametrize("kernels", ["pallas", "xla"])
def test_varlen_and_mixed_executables_compile(kernels):
    for label in ("varlen:64", "mixed:4x32"):
        compile_ok("tiny", kernels, label)


@SINGLE_STACK
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_other_dtypes_compile_without_spills(dtype):
    for label in ("1x1", "16x1", "2x17"):
        compile_ok("tiny", "pallas", label, dtype=dtype, ptxas=True)


@pytest.mark.parametrize("kernels, label", [("pallas", "1x1"), ("xla", "1x1"),
                                            pytest.param("pallas", "256x1", marks=SINGLE_STACK)])
def test_1_5b_decode_compiles(kernels, label):
    result = compile_ok("1.5b", kernels, label, ptxas=kernels == "pallas")
    summary = result.report.summary()
    if kernels == "pallas":  # the GPU step samples in straight-line code; XLA's keeps its lax.cond
        assert summary["conditionals"] == summary["while_loops"] == 0, summary
    else:
        assert summary["conditionals"] >= 1, summary
    if kernels == "pallas" and label == "1x1":
        counts = result.report.launch_counts("rwkv7")
        assert counts["rwkv7_wkv_step"] == 24 and counts["rwkv7_sparse_value_product"] == 24


def test_1_5b_fused_decode_compiles():
    """The fused decode path at B=1: ~8 launches a layer plus the straight-line sampler's
    fixed ~31 a step (benchmarks/results/straight_line_sampler_h200.md), registers
    reported, no spill, no device loop or conditional."""
    result = compile_ok("1.5b", "pallas-fused", "1x1", ptxas=True)
    counts = result.report.launch_counts("rwkv7")
    assert counts["rwkv7_wkv_tail"] == 24 and counts["rwkv7_shift_mix"] == 48, counts
    assert len(result.report.launches) < 9 * 24 + SAMPLER_LAUNCHES, len(result.report.launches)
    assert result.report.while_loops == result.report.conditionals == 0


@SINGLE_STACK
def test_1_5b_odd_prefill_compiles():
    compile_ok("1.5b", "pallas", "1x17")


def test_buckets_parse_into_the_engine_executables():
    assert deviceless.Bucket.parse("1x1") == deviceless.Bucket("step", 1, 1)
    assert deviceless.Bucket.parse("1x64") == deviceless.Bucket("prefill", 1, 64)
    assert deviceless.Bucket.parse("3x17") == deviceless.Bucket("forward", 3, 17)
    assert deviceless.Bucket.parse("varlen:128") == deviceless.Bucket("varlen", 1, 128)
    assert deviceless.Bucket.parse("mixed:8x64").path == "DENSE"
    assert deviceless.Bucket.parse("mixed:8x64").key == ("mixed", (8, 64))
    assert deviceless.Bucket.parse("3x17").key == ("forward", (3, 17, False))
    assert all(deviceless.Bucket.parse(label).key[0] in EXECUTABLES
               for label in ("1x1", "1x64", "3x17", "varlen:128", "mixed:8x64"))
    assert deviceless.Bucket.parse("300x1").path == "DENSE" and deviceless.Bucket.parse("300x1").kind == "step"
    for bad in ("1x", "x1", "0x1", "foo:3", "2", "varlen:x"):
        with pytest.raises(ValueError, match="bucket"):
            deviceless.Bucket.parse(bad)


def test_targets_carry_the_device_facts():
    assert H200.compute_capability == (9, 0) and H200.arch == "sm_90a"
    assert H200.sm_count == 132 and H200.shared_memory_optin == 232448 and H200.memory_bandwidth == 4.8e12
    h100 = deviceless.load_target("h100")
    assert h100.memory_bandwidth == 3.35e12 and h100.sm_count == 132
    with pytest.raises(ValueError, match="unknown GPU target"):
        deviceless.load_target("h999")


def test_cpu_executables_get_the_cpu_compile_options_and_gpu_ones_xla_defaults():
    """XLA:CPU compiles at LLVM level 1 (compile_speed.md: less compile, same speed); a model
    placed on the H200 target keeps XLA's defaults for the GPU, and both compile."""
    from rwkv_jax.compilation import CPU_COMPILER_OPTIONS
    from rwkv_jax.random_params import random_model

    cpu = JaxEngine(random_model(CONFIGS["tiny"], "float32"))
    assert cpu.executables.options == CPU_COMPILER_OPTIONS
    cpu.executables.get(("forward", (2, 1, False)))
    assert cpu.compile_seconds[("forward", (2, 1, False))] > 0
    gpu = _engine("tiny", "bfloat16", "xla")
    assert gpu.executables.options == {}
    assert compile_ok("tiny", "xla", "2x1").report.launches


def test_the_cuda_plugin_and_ptxas_in_use_are_named(monkeypatch):
    import re

    _engine("tiny", "bfloat16", "xla")  # registers the plugin of $RWKV7_CUDA_PLUGIN_DIR
    assert re.fullmatch(r"jax-cuda1[23]-plugin \S+", deviceless.cuda_plugin() or ""), deviceless.cuda_plugin()
    monkeypatch.setenv(deviceless.PLUGIN_ENV, "cuda11")
    with pytest.raises(ValueError, match="cuda11"):
        deviceless.plugin_names()


def test_ptxas_rejecting_a_newer_ptx_names_both_versions(tmp_path):
    """A PTX ISA newer than every ptxas here is a reported error, never a silent gap."""
    from rwkv_jax import gpu_dump

    ptx = tmp_path / "k.ptx"
    ptx.write_text(".version 99.9\n.target sm_90a\n.address_size 64\n.visible .entry rwkv7_k()\n{\nret;\n}\n")
    resources, errors = gpu_dump.ptxas_resources([str(ptx)], "sm_90a", "rwkv7")
    exe, release = gpu_dump.ptxas()
    assert resources == {} and len(errors) == 1
    assert "PTX ISA 99.9" in errors[0] and f"ptxas {release[0]}.{release[1]}" in errors[0], errors
