"""The native CPU products against their jnp reference (``matmul_f32``) on fresh random inputs:
every weight kind (float32, bfloat16, int8, int4, float8) and layout, row counts around the kernels' 4-row passes and the many-row
path's (rows of x left over after passes of 4; weight rows left over after blocks of 6 and
tiles), odd output widths (the tail rows and column blocks), and the shapes the kernels leave
to the reference."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpu_kernels import library
from cpu_kernels import linear as native
from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.small_m_linear import matmul_f32
from rwkv7_core.quantization import QuantSpec, quantize


def random_weight(rng, kind: str, N: int, K: int, axis: int, group: int = 32):
    if kind == "int8":
        return QuantizedWeight(jnp.asarray(rng.integers(-127, 128, (N, K)), jnp.int8),
                               jnp.asarray(rng.random((N, K // group)) * 0.02 + 1e-3, jnp.float32))
    if kind in ("int4", "fp8"):  # the package's quantizer: its packing and its float8 rounding
        q, scale = quantize(rng.standard_normal((N, K)).astype(np.float32),
                            QuantSpec(kind, group) if kind == "int4" else QuantSpec(kind))
        return QuantizedWeight(jnp.asarray(q), jnp.asarray(scale))
    w = jnp.asarray(rng.standard_normal((N, K) if axis == 1 else (K, N)), jnp.float32)
    return w.astype(jnp.bfloat16) if kind == "bf16" else w


def check(x, w, axis: int) -> None:
    got = np.asarray(jax.jit(lambda x, w: native.matmul_f32(x, w, axis))(x, w))
    want = np.asarray(jax.jit(lambda x, w: matmul_f32(x, w, axis))(x, w))
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 14, 19, 32])
@pytest.mark.parametrize("kind,axis", [("f32", 1), ("bf16", 1), ("int8", 1), ("int4", 1), ("fp8", 1), ("f32", 0),
                                       ("bf16", 0)])
def test_matches_the_reference(M, kind, axis):
    limit = native.max_rows(kind, native.NARROW_K, axis)
    if M > limit:
        pytest.skip(f"{kind} weights {'[N, K]' if axis == 1 else '[K, N]'} run the native product up to {limit} rows")
    rng = np.random.default_rng()
    N = int(rng.choice([112, 272])) if axis == 0 else int(rng.integers(1, 140))  # [K, N]: whole chunks and a tail
    K = 16 * int(rng.integers(1, 40)) if kind not in native.QUANTIZED else 64 * int(rng.integers(1, 8))
    if M > native.max_rows(kind, K, axis):  # a narrow K (the narrow bound is tested below)
        K = native.NARROW_K + 16 * int(rng.integers(0, 32))
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    assert native.supports(x, random_weight(rng, kind, N, K, axis), axis)
    check(x, random_weight(rng, kind, N, K, axis), axis)


@pytest.mark.parametrize("kind,M", [("f32", 9), ("bf16", 6), ("int8", 21)])
def test_many_rows_of_wide_weights(kind, M):
    if M > native.max_rows(kind, 2048):
        pytest.skip(f"{kind} weights run the native product up to {native.max_rows(kind, 2048)} rows on this build")
    """Weight rows wider than a tile's bytes allow for more than one block (a tile of 6 rows)."""
    rng = np.random.default_rng()
    K, N = 64 * int(rng.integers(33, 49)), int(rng.integers(20, 60))
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    check(x, random_weight(rng, kind, N, K, 1, 64), 1)


@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.parametrize("M", [1, 2, 3, 17, 32, 33])
def test_narrow_products_of_float32_rows(kind, M):
    """K under NARROW_K (the LoRA up products): native for one or two rows, and up to MANY_ROWS
    by the narrow kernel (16 weight rows' sums reduced together, the rows past the last 16 alone)
    where the build has MANY_ROWS; XLA's op above."""
    rng = np.random.default_rng()
    K = 16 * int(rng.integers(1, native.NARROW_K // 16))
    w = random_weight(rng, kind, int(rng.integers(1, 600)), K, 1)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    wide = library.MANY_ROWS in library.load().capabilities
    assert native.supports(x, w) == (M <= (native.MANY_ROWS if wide else native.MAX_ROWS_NARROW))
    check(x, w, 1)


@pytest.mark.parametrize("M", [3, 7, 32])
@pytest.mark.parametrize("K", [32, 64, 96])
def test_narrow_bfloat16_products_of_more_rows(M, K):
    """bfloat16 x with bfloat16 weights of K under NARROW_K (a bfloat16 model's LoRA up products)
    run their own narrow dot-product kernel up to MAX_ROWS["bf16_dot"] rows where the build has
    the dot product: 16 weight rows' sums reduced together, the rows past the last 16 alone."""
    rng = np.random.default_rng()
    N = int(rng.integers(1, 900))
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = random_weight(rng, "bf16", N, K, 1)
    dot = library.BF16_DOT in library.load().capabilities
    assert native.bf16_dot(x, w) == dot
    lowered = jax.jit(native.matmul_f32).lower(x, w).as_text()
    assert ("rwkv7_linear_bf16_dot" in lowered) == dot
    check(x, w, 1)


def test_more_rows_than_the_kn_layout_takes_run_xla():
    rng = np.random.default_rng()
    w = random_weight(rng, "f32", 48, 64, 0)
    x = jnp.asarray(rng.standard_normal((native.MAX_ROWS_KN + 1, 64)), jnp.float32)
    assert not native.supports(x, w, 0) and native.supports(x[:native.MAX_ROWS_KN], w, 0)
    assert "rwkv7_" not in jax.jit(lambda x, w: native.matmul_f32(x, w, 0)).lower(x, w).as_text()


def test_a_quantized_weight_is_n_by_k_whatever_the_layout_says():
    """The channel-mix value passes w_in_axis=0, but a quantized weight is always [N, K]: it runs
    native up to int8's row bound, not the [K, N] layout's (it went to XLA's dequantize-then-dot
    above 8 rows)."""
    rng = np.random.default_rng()
    M = int(rng.integers(native.MAX_ROWS_KN + 1, native.max_rows("int8", 256) + 1))
    w = random_weight(rng, "int8", int(rng.integers(1, 80)), 256, 1, 64)
    x = jnp.asarray(rng.standard_normal((M, 256)), jnp.float32)
    assert native.supports(x, w, 0)
    assert "rwkv7_linear_int8" in jax.jit(lambda x, w: native.matmul_f32(x, w, 0)).lower(x, w).as_text()
    check(x, w, 0)


@pytest.mark.parametrize("kind,group", [("int8", 16), ("int8", 64), ("int8", 128), ("int4", 32), ("int4", 64),
                                        ("int4", 128)])
def test_quantized_group_sizes(kind, group):
    """int4 groups hold their low nibbles' channels then their high ones' (two runs of x a group)."""
    rng = np.random.default_rng()
    x = jnp.asarray(rng.standard_normal((int(rng.integers(1, 6)), 256)), jnp.float32)
    check(x, random_weight(rng, kind, 37, 256, 1, group), 1)


@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.parametrize("zeros", [0.7, 1.0])
def test_rows_of_zeros_skip_their_weight_rows_exactly(kind, zeros):
    """A one-row [K, N] product reads only the weight rows of non-zero inputs (relu^2 leaves most
    hidden units at zero): the result is the product over the other rows, zeros when none is."""
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 512)).astype(np.float32)
    x[:, rng.random(512) < zeros] = 0.0
    w = random_weight(rng, kind, int(rng.choice([96, 272])), 512, 0)
    check(jnp.asarray(x), w, 0)
    if zeros == 1.0:
        assert not np.asarray(native.matmul_f32(jnp.asarray(x), w, 0)).any()


@pytest.mark.parametrize("M,K", [(1, 128), (3, 768), (4, 128), (13, 800), (32, 768), (32, 64), (2, 48)])
def test_bfloat16_inputs_with_bfloat16_weights(M, K):
    """By the bfloat16 dot-product kernel where the build has it and K is a multiple of 32
    (exact pair products: only the order of the float32 sums differs), else widened."""
    rng = np.random.default_rng()
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = random_weight(rng, "bf16", int(rng.integers(1, 100)), K, 1)
    dot = library.BF16_DOT in library.load().capabilities and K % 32 == 0 and M <= native.max_rows("bf16_dot", K)
    assert native.bf16_dot(x, w) == dot
    lowered = jax.jit(native.matmul_f32).lower(x, w).as_text()
    assert ("rwkv7_linear_bf16_dot" in lowered) == dot
    if not dot:
        assert ("rwkv7_linear_bf16" in lowered) == (M <= native.max_rows("bf16", K))
    check(x, w, 1)


@pytest.mark.parametrize("M", [1, 2, 5, 8, 11, 32, 33])
def test_bfloat16_inputs_with_bfloat16_weights_in_the_kn_layout(M):
    """[K, N] weights (the channel-mix value) by the bfloat16 dot product from 2 rows where the
    build has it and N is a multiple of its column block: each pair of weight rows interleaved
    into a packed tile (K not a multiple of the tile's rows leaves a short last tile), the column
    order restored at the end; one row keeps the widening kernel's listed non-zero rows."""
    rng = np.random.default_rng()
    K = 2 * int(rng.integers(1, 400))
    N = native.KN_DOT_COLUMNS * int(rng.integers(1, 5)) + (0 if M != 8 else 16)  # 8 rows: a width it leaves
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((K, N)), jnp.bfloat16)
    dot = (library.BF16_DOT in library.load().capabilities and N % native.KN_DOT_COLUMNS == 0
           and native.KN_DOT_MIN_ROWS <= M <= native.MAX_ROWS["bf16_dot"])
    assert native.bf16_dot(x, w, 0) == dot
    lowered = jax.jit(lambda x, w: native.matmul_f32(x, w, 0)).lower(x, w).as_text()
    assert ("rwkv7_linear_kn_bf16_dot" in lowered) == dot
    if not dot and K % 16 == 0 and N % 16 == 0:
        assert ("rwkv7_linear_kn_bf16" in lowered) == (M <= native.MAX_ROWS_KN)
    check(x, w, 0)


@pytest.mark.parametrize("M", [1, 5, 6, 11, 12, 13, 20, 33, 300])
@pytest.mark.parametrize("kind,group", [("int8", 16), ("int8", 32), ("int8", 64), ("int8", 128), ("int4", 32),
                                        ("int4", 128), ("fp8", 0)])
def test_bfloat16_inputs_with_quantized_weights(M, kind, group):
    """By the quantized dot-product kernel where the build has the bfloat16 dot product, from
    QUANTIZED_DOT_MIN_ROWS rows and with groups a multiple of 32 (float8: one scale a row; tiles of
    weight rows converted to bfloat16 exactly, int4's two runs a group in channel order, each
    group's sum scaled: only the order of the float32 sums differs; odd rows of x and weight rows
    past the blocks of 4, several tiles, chunks and blocks of rows of x), with no upper bound on
    the rows, else widened."""
    rng = np.random.default_rng()
    K, N = 128 * int(rng.integers(1, 13)), int(rng.integers(1, 700))
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = random_weight(rng, kind, N, K, 1, group)
    dot = library.BF16_DOT in library.load().capabilities and group % 32 == 0 and M >= native.QUANTIZED_DOT_MIN_ROWS[kind]
    assert native.quantized_dot(x, w) == dot
    lowered = jax.jit(native.matmul_f32).lower(x, w).as_text()
    assert ("rwkv7_linear_quantized_dot" in lowered) == dot
    check(x, w, 1)


@pytest.mark.parametrize("case", ["too many rows", "K not a multiple of 16", "float16 weight", "int4 groups of 16"])
def test_shapes_it_does_not_take_run_the_reference(case):
    rng = np.random.default_rng()
    M, K, w = 2, 64, random_weight(rng, "f32", 24, 64, 1)
    if case == "too many rows":
        M = native.max_rows("f32", K) + 1
    elif case == "K not a multiple of 16":
        K, w = 40, random_weight(rng, "f32", 24, 40, 1)
    elif case == "float16 weight":
        w = w.astype(jnp.float16)
    else:
        w = QuantizedWeight(jnp.zeros((24, 32), jnp.uint8), jnp.ones((24, 4), jnp.float32))
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    assert not native.supports(x, w)
    lowered = jax.jit(native.matmul_f32).lower(x, w).as_text()
    assert "rwkv7_" not in lowered
    np.testing.assert_array_equal(np.asarray(native.matmul_f32(x, w)), np.asarray(matmul_f32(x, w)))
