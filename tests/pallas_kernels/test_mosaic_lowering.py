"""Every Pallas Mosaic GPU kernel compiles for an H200 on this CPU-only machine (a deviceless
compile: Mosaic's own lowering, PTX, ptxas), at the 1.5b shapes in bfloat16 and the edges the
engine reaches: one row and 16 (the most the products serve: narrowed tiles), LoRA widths 96 and
64 beside 256, C = 192 rows padded to warpgroup vectors, the whole state leaves updated in place,
a delta of 32 split-K partials (the sparse value product's at B = 1). ptxas (sm_90a, ``MOSAIC_GPU_DUMP_PTXAS``) finds no register spill and every kernel's shared
memory fits the H200's opt-in limit. Needs jax >= 0.11 and the CUDA plugin's Mosaic runtime
(skipped naming what is missing)."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.segment_linear import SplitSum, padded_rows
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

if jax_version() >= MOSAIC_MIN_JAX:  # Pallas Mosaic GPU exists from jax 0.11
    from pallas_kernels.mosaic import ffn_value, lora_up, segment_linear, shift_mix, wkv_tail
    from rwkv_jax.mosaic_resources import recorded

BF16, F32 = jnp.bfloat16, jnp.float32
C, H, N, F, V, L = 2048, 32, 64, 8192, 65536, 24
LORA = {"w": 96, "a": 96, "v": 64, "g": 256}
SD = jax.ShapeDtypeStruct
KERNELS = ("rwkv7_mosaic_shift_mix", "rwkv7_mosaic_segment_linear", "rwkv7_mosaic_lora_up", "rwkv7_mosaic_wkv_tail",
           "rwkv7_mosaic_ffn_value")


def _cases(M: int) -> list:
    """[(fn, arg structs)] for M rows: every Mosaic kernel of the decode step at the 1.5b shapes."""
    Mp = padded_rows(M)
    downs = [SD((C, C), BF16)] * 3 + [SD((d, C), BF16) for d in LORA.values()]
    n_down = 3 * C + sum(LORA.values())
    offsets = [3 * C + sum(list(LORA.values())[:i]) for i in range(4)]
    ups = [SD((C, d), BF16) for d in LORA.values()]
    return [
        (lambda h, p, s, w, b, mix: shift_mix.shift_mix(h, SplitSum(p, M, BF16), s, w, b, mix, layer=5),
         (SD((M, C), BF16), SD((32, Mp, C), F32), SD((M, L, C), BF16), SD((C,), BF16), SD((C,), BF16),
          SD((6, C), BF16))),
        (lambda h, d, s, w, b, mix: shift_mix.shift_mix(h, d, s, w, b, mix),
         (SD((M, 192), BF16), SD((M, 192), BF16), SD((M, 192), BF16), SD((192,), BF16), SD((192,), BF16),
          SD((1, 192), BF16))),
        (lambda xs, *ws: segment_linear.segment_linear(xs, list(ws), [0, 2, 3, 1, 4, 3, 5]),
         (SD((6, M, C), BF16), *downs)),
        (lambda x, w: segment_linear.segment_linear(x, [w], [0]), (SD((1, M, C), BF16), SD((V, C), BF16))),
        (lambda p, *u: lora_up.lora_up(p, list(u), offsets, "wavg", M=M, dtype=BF16),
         (SD((2, Mp, n_down), F32), *ups)),
        (lambda p, lo, vecs, rk, vf, S: wkv_tail.wkv_tail(p, lo, vecs, rk, vf, S, layer=3),
         (SD((2, Mp, n_down), F32), SD((4, Mp, C), BF16), SD((7, C), F32), SD((H, N), F32), SD((M, C), F32),
          SD((M, L, H, N, N), F32))),
        (lambda p, w: ffn_value.ffn_value(p, w, M=M, dtype=BF16), (SD((2, Mp, F), F32), SD((F, C), BF16))),
    ]


@pytest.mark.parametrize("M", [1, 16])
def test_every_mosaic_kernel_compiles_for_the_h200_without_spills(M):
    cases = _cases(M)

    def program(*arg_lists):
        return [fn(*args) for (fn, _), args in zip(cases, arg_lists)]

    with recorded() as kernels:
        deviceless.compile_function(program, tuple(args for _, args in cases), H200, plugin_dir=PLUGIN_DIR,
                                    ptxas=False)
    assert sorted({k.name for k in kernels}) == sorted(KERNELS), [k.name for k in kernels]
    for k in kernels:
        assert k.registers > 0 and k.spill_bytes == 0, k
        assert 0 < k.smem_bytes <= H200.shared_memory_optin, k
