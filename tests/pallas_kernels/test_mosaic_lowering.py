"""Every Pallas Mosaic GPU kernel compiles for an H200 on this CPU-only machine (a deviceless
compile: Mosaic's own lowering, PTX, ptxas), at the 1.5b shapes in bfloat16 and the edges the
engine reaches: one row and 16 (the most the products serve: narrowed tiles), LoRA widths 96 and
64 beside 256, C = 192 rows padded to warpgroup vectors, the whole state leaves updated in place,
a delta of 32 split-K partials (the sparse value product's at B = 1): the cases are
``benchmarks/decode_mosaic_report.kernel_cases`` (its report lists the same compile). ptxas
(sm_90a, ``MOSAIC_GPU_DUMP_PTXAS``) finds no register spill and every kernel's shared memory
fits the H200's opt-in limit. Needs jax >= 0.11 and the CUDA plugin's Mosaic runtime
(skipped naming what is missing)."""
from __future__ import annotations

import os

import jax.numpy as jnp
import pytest

from benchmarks.decode_mosaic_report import compile_kernels
from rwkv7_core.config import named_config
from rwkv_jax import deviceless
from rwkv_jax.kernels import MOSAIC_MIN_JAX, jax_version
from tests.gpu_target import H200, PLUGIN_DIR

pytestmark = [
    pytest.mark.skipif(jax_version() < MOSAIC_MIN_JAX, reason="Pallas Mosaic GPU needs jax >= 0.11"),
    pytest.mark.skipif(not any(os.path.isfile(os.path.join(PLUGIN_DIR, f"jax_{name}_plugin", deviceless.MOSAIC_RUNTIME))
                               for name in deviceless.CUDA_PLUGINS),
                       reason=f"no CUDA plugin with {deviceless.MOSAIC_RUNTIME} in {PLUGIN_DIR} "
                              f"(set {deviceless.PLUGIN_DIR_ENV})"),
]

KERNELS = ("rwkv7_mosaic_shift_mix", "rwkv7_mosaic_segment_linear", "rwkv7_mosaic_lora_up", "rwkv7_mosaic_wkv_tail",
           "rwkv7_mosaic_ffn_value")


@pytest.mark.parametrize("M", [1, 16])
def test_every_mosaic_kernel_compiles_for_the_h200_without_spills(M):
    kernels = compile_kernels(named_config("1.5b"), M, jnp.bfloat16, H200, plugin_dir=PLUGIN_DIR)
    assert sorted({k.name for k in kernels}) == sorted(KERNELS), [k.name for k in kernels]
    for k in kernels:
        assert k.registers > 0 and k.spill_bytes == 0, k
        assert 0 < k.smem_bytes <= H200.shared_memory_optin, k
