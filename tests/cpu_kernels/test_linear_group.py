"""``matmul_group``: several products as one native call, each result bit for bit what the
product gives alone (``matmul_f32``), on fresh random mixes of weight kinds, widths and row
counts, with the products the kernels do not take left out of the call; and the call's
one-line errors for operands that do not match its kinds."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cpu_kernels import library
from cpu_kernels import linear as native
from tests.cpu_kernels.test_linear import random_weight

KINDS = ["f32", "bf16", "int8", "int4", "fp8", "bf16_dot", "int8_dot", "int4_dot", "fp8_dot"]


def random_product(rng, kind: str, M: int):
    """(x [M, K], w [N, K]) of `kind`: bf16_dot is a bfloat16 x with a bfloat16 weight, int8_dot,
    int4_dot and fp8_dot with a quantized one."""
    if kind in native.QUANTIZED or kind.endswith("_dot") and kind != "bf16_dot":
        K = 64 * int(rng.integers(1, 13))
    else:  # not narrow (K < NARROW_K runs native for one or two rows only)
        K = native.NARROW_K + (64 if kind == "bf16_dot" else 16) * int(rng.integers(0, 10))
    N = int(rng.integers(1, 300))
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    if kind == "bf16_dot":
        return x.astype(jnp.bfloat16), random_weight(rng, "bf16", N, K, 1)
    if kind in ("int8_dot", "int4_dot", "fp8_dot"):  # a dot product from QUANTIZED_DOT_MIN_ROWS rows, else widened
        return x.astype(jnp.bfloat16), random_weight(rng, kind[:-4], N, K, 1, int(rng.choice([32, 64])))
    return x, random_weight(rng, kind, N, K, 1)


def calls(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("@rwkv7_linear_group(")


@pytest.mark.parametrize("M", [1, 2, 5, 13])
def test_each_result_is_what_the_product_gives_alone(M):
    rng = np.random.default_rng()
    # the kinds this build runs natively at M rows (float32 / bfloat16 weights: 8 without MANY_ROWS;
    # a bfloat16 weight without the dot product is widened)
    dot = library.BF16_DOT in library.load().capabilities
    runs_as = {"int8_dot": "int8", "int4_dot": "int4", "fp8_dot": "fp8", "bf16_dot": "bf16_dot" if dot else "bf16"}
    taking = [k for k in KINDS if M <= native.max_rows(runs_as.get(k, k), 2 * native.NARROW_K)]
    kinds = list(rng.choice(taking, int(rng.integers(2, 8))))
    pairs = [random_product(rng, str(kind), M) for kind in kinds]
    pairs.insert(int(rng.integers(0, len(pairs) + 1)),  # one the kernels leave to the reference
                 (jnp.asarray(rng.standard_normal((M, 40)), jnp.float32), random_weight(rng, "f32", 24, 40, 1)))
    taken = sum(native.group_kind(x, w) is not None for x, w in pairs)
    assert taken == len(pairs) - 1
    got = jax.jit(native.matmul_group)(pairs)
    assert calls(native.matmul_group, pairs) == (taken >= 2)
    for (x, w), y in zip(pairs, got):
        want = jax.jit(native.matmul_f32)(x, w)
        assert y.dtype == jnp.float32 and y.shape == want.shape
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))


def test_bf16_dot_products_need_the_capability():
    rng = np.random.default_rng()
    x, w = random_product(rng, "bf16_dot", 1)
    dot = library.BF16_DOT in library.load().capabilities
    assert native.group_kind(x, w) == native.GROUP_KINDS["bf16_dot" if dot else "bf16"]
    for kind in ("int8", "int4", "fp8"):
        x, w = random_product(rng, kind + "_dot", native.QUANTIZED_DOT_MIN_ROWS[kind])
        assert native.group_kind(x, w) == native.GROUP_KINDS[kind + "_dot" if dot else kind]


def test_one_product_runs_alone():
    rng = np.random.default_rng()
    pairs = [random_product(rng, "int8", 1)]
    assert calls(native.matmul_group, pairs) == 0
    np.testing.assert_array_equal(np.asarray(jax.jit(native.matmul_group)(pairs)[0]),
                                  np.asarray(jax.jit(native.matmul_f32)(*pairs[0])))


@pytest.mark.parametrize("case", ["unknown kind", "kind of another dtype", "missing scale", "int4 of another width",
                                  "int8 dot of a float32 x"])
def test_operands_that_do_not_match_their_kinds_fail_in_one_line(case):
    library.load()
    rng = np.random.default_rng()
    x, w = random_product(rng, "f32", 1)
    kinds = {"unknown kind": [7], "kind of another dtype": [native.GROUP_KINDS["bf16"]],
             "missing scale": [native.GROUP_KINDS["int8"]], "int4 of another width": [native.GROUP_KINDS["int4"]],
             "int8 dot of a float32 x": [native.GROUP_KINDS["int8_dot"]]}[case]
    operands = (x, w)
    if case == "int8 dot of a float32 x":
        if library.BF16_DOT not in library.load().capabilities:
            pytest.skip("this build has no bfloat16 dot product (its own one-line error is tested above)")
        operands = (x, jnp.zeros((w.shape[0], x.shape[1]), jnp.int8), jnp.ones((w.shape[0], 1), jnp.float32))
    if case == "int4 of another width":  # packed bytes for K, not K / 2
        operands = (x, jnp.zeros((w.shape[0], x.shape[1]), jnp.uint8), jnp.ones((w.shape[0], 1), jnp.float32))
    call = jax.ffi.ffi_call("rwkv7_linear_group", [jax.ShapeDtypeStruct((1, w.shape[0]), jnp.float32)])
    with pytest.raises(Exception, match="rwkv7_linear_group: want"):
        jax.block_until_ready(jax.jit(lambda *ops: call(*ops, kinds=np.array(kinds, np.int64)))(*operands))
