"""Matrix products of a few rows through the native CPU kernels (``linear.cc``), in the
contract of their plain-jnp reference ``pallas_kernels.small_m_linear.matmul_f32``.

``matmul_f32(x [M, K], w, w_in_axis=1) -> [M, N] float32``: x @ w.T for w [N, K] (w_in_axis=1)
or x @ w for w [K, N] (w_in_axis=0), w float32 or bfloat16, or a ``QuantizedWeight``
(q int8 [N, K], packed int4 uint8 [N, K / 2] or float8_e4m3fn [N, K]; scale float32 [N, K / G],
G a multiple of 16, 32 for int4). x is widened to float32 (a bfloat16 x with a
bfloat16 weight stays bfloat16 where the build has ``library.BF16_DOT``: pairs multiplied
exactly by the CPU's bfloat16 dot product, [N, K] weights with K a multiple of 32, [K, N] ones
(the channel-mix value) from 2 rows with N a multiple of 64; and a bfloat16 x of
``QUANTIZED_DOT_MIN_ROWS`` rows or more (no upper bound: prefill too) with quantized weights whose
group is a multiple of 32: each tile of weight rows converted once to bfloat16, exactly, and every
group's pair products summed by the dot product, then scaled); otherwise the weight is widened in
registers as it streams, so a product reads each weight byte once per pass of up to 4 rows
and writes no float copy of it (more rows with ``library.MANY_ROWS``: a tile of weight rows at
a time, bfloat16 widened once into a float32 buffer that stays in cache while every row of x
passes). Shapes the kernels do not take (``supports``: more than ``max_rows`` for the weight
kind and layout, K or N not a multiple of 16, other weight dtypes) run the reference. The
results differ from the reference only by float32 summation order.

``matmul_group([(x_i, w_i)]) -> [y_i]``: several [N, K] products as one call whose results are
each bit for bit ``matmul_f32``'s (see its doc).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.small_m_linear import matmul_f32 as reference_matmul_f32

from . import library
from .library import LANES

# rwkv7_linear_group's weight kinds (linear.cc's GroupKind)
GROUP_KINDS = {"f32": 0, "bf16": 1, "int8": 2, "bf16_dot": 3, "int4": 4, "fp8": 5, "int8_dot": 6, "int4_dot": 7,
               "fp8_dot": 8}
DOT_KINDS = tuple(GROUP_KINDS[k] for k in ("bf16_dot", "int8_dot", "int4_dot", "fp8_dot"))  # their x stays bfloat16
WEIGHT_NAMES = {jnp.dtype(jnp.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.int8): "int8",
                jnp.dtype(jnp.uint8): "int4", jnp.dtype(jnp.float8_e4m3fn): "fp8"}
QUANTIZED = ("int8", "int4", "fp8")
# Rows up to which the native product runs, by weight kind ([N, K] weights; more go to XLA's op),
# measured on the 0.1b products (docs/benchmarks.md, "Native CPU kernels"). Without
# ``library.MANY_ROWS`` float32 and bfloat16 weights are faster through XLA's GEMM (YNNPACK) from
# 16 rows; int8 weights, which XLA dequantizes into a float32 scratch first, are faster native up
# to 32 rows (784 vs 626 tok/s at B = 32) and even at 64-128; bfloat16 x bfloat16 by the dot
# product too (560-600 GFLOP/s at 32 rows, XLA's 360-440).
# int4 and float8 weights, which XLA also dequantizes first, too (0.1b step at 1 / 4 / 8 / 16 / 32
# rows, native over XLA: int4 18x / 36x / 3.2x / 1.41x / 1.14x, float8 1.56x / 3.4x / 2.2x /
# 1.61x / 1.28x).
MAX_ROWS = {"f32": 8, "bf16": 8, "int8": 32, "bf16_dot": 32, "int4": 32, "fp8": 32}
# With ``library.MANY_ROWS`` (4 rows of x against 6 weight rows a step): at 32 rows 260-310
# GFLOP/s against XLA's 200-240 with float32 weights, 220-260 against 60 with bfloat16 weights
# and float32 x; level with XLA at 64-128 rows.
MANY_ROWS = 32
# [K, N] weights (the channel-mix value): XLA's GEMM is faster from 16 rows (270 against 180
# GFLOP/s at 32 rows, float32).
MAX_ROWS_KN = 8
# bfloat16 x [K, N] bfloat16 by the dot product: from 2 rows (one row keeps the listed non-zero
# rows of the widening kernel: relu^2 leaves many inputs at zero) up to MAX_ROWS["bf16_dot"], N a
# multiple of its column block.
KN_DOT_MIN_ROWS, KN_DOT_COLUMNS = 2, 64
# bfloat16 x with quantized weights by the dot product: from QUANTIZED_DOT_MIN_ROWS[kind] rows, the
# group a multiple of 32, with no upper bound (rows of x in blocks that stay in L2: 500-600
# GFLOP/s at 32-2,048 rows on the 0.1b shapes, against XLA's dequantize-and-dot at 120-440).
# Fewer rows stream the weight widened in registers against float32 rows, bound by memory. The
# 0.1b step with bfloat16 rows, dot over widened, by rows: int8 8: 0.93x, 12: 1.07x, 16: 1.12x,
# 32: 1.25x; int4 (whose widening costs more) 4: 0.83x, 6: 1.15x, 8: 1.20x, 16: 1.47x, 32: 1.72x;
# float8 8: 0.99x, 16: 1.32x, 32: 1.49x.
QUANTIZED_DOT_MIN_ROWS = {"int8": 12, "int4": 6, "fp8": 12}
# Narrow products (K under NARROW_K: the LoRA up products, K = 32 / 64): each output is a short
# dot product whose final sum across the vector lanes costs as much as its few steps, so XLA's
# GEMM is faster from 4 rows (K = 32 at 4 rows: 25 against 38 GFLOP/s; K = 64 at 32 rows: 156
# against 242, bfloat16 dot 129 against 275); one or two rows stay native. Narrow kernels of their
# own (16 weight rows' sums reduced together) take more rows: bfloat16 x bfloat16 by the dot
# product up to MAX_ROWS["bf16_dot"], float32 x with ``library.MANY_ROWS`` up to MANY_ROWS.
NARROW_K, MAX_ROWS_NARROW = 128, 2


def max_rows(kind: str, K: int, w_in_axis: int = 1) -> int:
    """Rows up to which the native product of a ``kind`` weight ("f32" | "bf16" | "int8" | "int4" |
    "fp8" | "bf16_dot") with K input channels in layout ``w_in_axis`` runs on this build."""
    if w_in_axis == 0:
        return MAX_ROWS_KN
    if K < NARROW_K and kind not in QUANTIZED:  # the narrow kernels (linear.cc), where the build has them
        if kind == "bf16_dot":
            return MAX_ROWS["bf16_dot"]
        return MANY_ROWS if library.MANY_ROWS in library.load().capabilities else MAX_ROWS_NARROW
    if kind in ("f32", "bf16") and library.MANY_ROWS in library.load().capabilities:
        return MANY_ROWS
    return MAX_ROWS[kind]


def supports(x, w, w_in_axis: int = 1) -> bool:
    """Whether the native kernels take x [M, K] and w (see module doc)."""
    M, K = x.shape
    quantized = isinstance(w, QuantizedWeight)
    kind = WEIGHT_NAMES.get(jnp.dtype(w.q.dtype if quantized else w.dtype))
    # a quantized weight is [N, K] whatever w_in_axis says (the channel-mix value's too)
    if kind is None or M > max_rows(kind, K, 1 if quantized else w_in_axis) or K % LANES:
        return False
    if quantized:
        groups = w.scale.shape[1]
        return K % groups == 0 and (K // groups) % (2 * LANES if kind == "int4" else LANES) == 0
    return kind not in QUANTIZED and (w_in_axis == 1 or w.shape[1] % LANES == 0)


def bf16_dot(x, w, w_in_axis: int = 1) -> bool:
    """Whether x @ w runs a bfloat16 dot-product kernel (see module doc)."""
    M, K = x.shape
    if (x.dtype != jnp.bfloat16 or isinstance(w, QuantizedWeight) or w.dtype != jnp.bfloat16
            or library.BF16_DOT not in library.load().capabilities):
        return False
    if w_in_axis == 0:
        return KN_DOT_MIN_ROWS <= M <= MAX_ROWS["bf16_dot"] and K % 2 == 0 and w.shape[1] % KN_DOT_COLUMNS == 0
    return K % (2 * LANES) == 0 and M <= max_rows("bf16_dot", K)


def quantized_dot(x, w) -> bool:
    """Whether x @ w.T runs the quantized dot-product kernel (see module doc)."""
    M, K = x.shape
    if (x.dtype != jnp.bfloat16 or not isinstance(w, QuantizedWeight)
            or library.BF16_DOT not in library.load().capabilities):
        return False
    kind = WEIGHT_NAMES[jnp.dtype(w.q.dtype)]
    groups = w.scale.shape[1]
    return (M >= QUANTIZED_DOT_MIN_ROWS[kind] and w.shape[1] == K and K % groups == 0
            and (K // groups) % (2 * LANES) == 0)


def matmul_f32(x, w, w_in_axis: int = 1):
    """x [M, K] @ w -> [M, N] float32 (the reference's contract, see module doc)."""
    if quantized_dot(x, w):
        out = jax.ShapeDtypeStruct((x.shape[0], w.q.shape[0]), jnp.float32)
        return jax.ffi.ffi_call("rwkv7_linear_quantized_dot", out)(x, w.q, w.scale)
    if bf16_dot(x, w, w_in_axis):
        target = "rwkv7_linear_bf16_dot" if w_in_axis == 1 else "rwkv7_linear_kn_bf16_dot"
        out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1 - w_in_axis]), jnp.float32)
        return jax.ffi.ffi_call(target, out)(x, w)
    if not supports(x, w, w_in_axis):
        return reference_matmul_f32(x, w, w_in_axis)
    library.load()
    M, x = x.shape[0], x.astype(jnp.float32)
    if isinstance(w, QuantizedWeight):
        out = jax.ShapeDtypeStruct((M, w.q.shape[0]), jnp.float32)
        return jax.ffi.ffi_call("rwkv7_linear_" + WEIGHT_NAMES[jnp.dtype(w.q.dtype)], out)(x, w.q, w.scale)
    layout = "rwkv7_linear_" if w_in_axis == 1 else "rwkv7_linear_kn_"
    out = jax.ShapeDtypeStruct((M, w.shape[1 - w_in_axis]), jnp.float32)
    return jax.ffi.ffi_call(layout + WEIGHT_NAMES[jnp.dtype(w.dtype)], out)(x, w)


def group_kind(x, w) -> int | None:
    """The ``rwkv7_linear_group`` kind (``GROUP_KINDS``) of x @ w in [N, K] layout, or None for a
    product the native kernels do not take (it runs alone, as ``matmul_f32`` runs it)."""
    if bf16_dot(x, w):
        return GROUP_KINDS["bf16_dot"]
    if quantized_dot(x, w):
        return GROUP_KINDS[WEIGHT_NAMES[jnp.dtype(w.q.dtype)] + "_dot"]
    if not supports(x, w):
        return None
    return GROUP_KINDS[WEIGHT_NAMES[jnp.dtype(w.q.dtype if isinstance(w, QuantizedWeight) else w.dtype)]]


def matmul_group(pairs: list) -> list:
    """[(x_i [M, K_i], w_i [N_i, K_i])] -> [x_i @ w_i.T float32 [M, N_i]], each bit for bit what
    ``matmul_f32`` gives alone. The products the native kernels take run as one call
    (``rwkv7_linear_group``): their chunks of weight rows share one hand-out to the thread pool,
    so a layer's short one-row products wake the pool's thread once, not once each."""
    kinds = [group_kind(x, w) for x, w in pairs]
    grouped = [i for i, kind in enumerate(kinds) if kind is not None]
    if len(grouped) < 2:
        return [matmul_f32(x, w) for x, w in pairs]
    operands, shapes = [], []
    for i in grouped:
        x, w = pairs[i]
        x = x if kinds[i] in DOT_KINDS else x.astype(jnp.float32)
        operands += [x, w.q, w.scale] if isinstance(w, QuantizedWeight) else [x, w]
        shapes.append(jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32))
    call = jax.ffi.ffi_call("rwkv7_linear_group", shapes)
    out = dict(zip(grouped, call(*operands, kinds=np.array([kinds[i] for i in grouped], np.int64))))
    return [out[i] if i in out else matmul_f32(x, w) for i, (x, w) in enumerate(pairs)]
