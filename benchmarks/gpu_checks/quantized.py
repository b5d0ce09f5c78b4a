"""Section quantized: the quantized kernels' device parity, then decode rows with int4, int8
(library groups) and fp8 weights on the Pallas kernels that dequantize in registers: tok/s
and the fraction of the HBM roofline of the quantized step's bytes."""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu_checks.common import attempt, block, kernel_names, params_for
from benchmarks.gpu_checks.decode import measure_model
from benchmarks.gpu_checks.parity import kernel_parity
from benchmarks.gpu_checks.schedule import QUANTIZED_BUDGET_S, Budget, CompileClock
from pallas_kernels import quantized_channel_mix, quantized_linear
from pallas_kernels.fused_time_mix import fused_channel_mix
from pallas_kernels.quantized import QuantizedWeight
from rwkv7_core.config import ModelConfig, named_config
from rwkv7_core.quantization import quantize, spec_for
from rwkv_jax.model import Model
from rwkv_jax.random_params import params_struct

QUANTIZED_SCHEMES = ("int4", "int8", "fp8")  # in this order: a cold run reaches 1.5b B=1 int4
# spread of the drawn values (int8 within +-127; int4: uniform random bytes, each nibble uniform in -8..7)
Q_STD = {"int8": 40.0, "fp8": 64.0, "int4": 4.6}


def quantized_items(smoke: bool, fused: str, pallas: str) -> list:
    """(model, kernels, scheme, B) in priority order: 1.5b B=1, 2.9b B=1, the other decode
    buckets, then the unfused Pallas kernels at B=1. --smoke: the tiny model on xla (the code
    path; the interpreted kernels are checked by the tests)."""
    if smoke:
        return [("tiny", "xla", "int8", 1)]
    items = [(name, fused, q, 1) for name in ("1.5b", "2.9b") for q in QUANTIZED_SCHEMES]
    items += [(name, fused, q, B) for name in ("1.5b", "2.9b") for B in (8, 32, 256, 2, 4, 16, 64, 128)
              for q in QUANTIZED_SCHEMES]
    return items + [(name, pallas, q, 1) for name in ("1.5b", "2.9b") for q in QUANTIZED_SCHEMES]


def _draw_quantized(struct: dict, plain, key):
    """params_struct's tree with every quantized weight drawn (q: normal x Q_STD rounded into the
    scheme's type; scales 1 / (Q_STD sqrt(in)), so the weights are ~N(0, 1/in) as the plain
    ones) and every other leaf taken from the plain random params."""
    if isinstance(struct, dict) and set(struct) == {"q", "scale"}:
        q, width = struct["q"], struct["q"].shape[1]
        scheme = {jnp.dtype(jnp.int8): "int8", jnp.dtype(jnp.uint8): "int4"}.get(q.dtype, "fp8")
        values = Q_STD[scheme] * jax.random.normal(key, q.shape)
        values = jnp.clip(jnp.round(values), -127, 127) if scheme == "int8" else values
        if scheme == "int4":  # packed: two values a byte, twice the width
            values, width = jax.random.randint(key, q.shape, 0, 256), 2 * width
        return {"q": values.astype(q.dtype),
                "scale": jnp.full(struct["scale"].shape, 1 / (Q_STD[scheme] * math.sqrt(width)), jnp.float32)}
    if isinstance(struct, dict):
        return {k: _draw_quantized(v, plain[k], jax.random.fold_in(key, i)) for i, (k, v) in enumerate(struct.items())}
    return plain


@functools.lru_cache(maxsize=None)


def quantized_params_for(config: ModelConfig, dtype, scheme: str) -> dict:
    """Random params of a config with its large projections drawn quantized (`scheme`, the
    library's default int8 group), on the default device; made once per run."""
    struct = params_struct(config, dtype, spec_for(scheme))
    return block(_draw_quantized(struct, params_for(config, dtype), jax.random.key(1)))


def measure_quantized(config: ModelConfig, dtype, kernels: str, scheme: str, B: int, smoke: bool, roofline) -> dict:
    """measure_model of a random model with `scheme` weights, and its params' bytes."""
    params = quantized_params_for(config, dtype, scheme)
    model = Model(params, config, dtype, kernels)
    return {**measure_model(model, B, 1, smoke, roofline), "params_bytes": sum(x.nbytes for x in jax.tree.leaves(params))}


def quantized_row(name, kernels, scheme, B, smoke, roofline, budget, clock) -> dict:
    """One quantized decode row (measure_model: tok/s and the roofline fractions of the step's
    bytes, the quantized weights' bytes), or why it was skipped."""
    label = f"{kernels} {scheme}"
    row = {"model": name, "kernels": kernels, "quantization": scheme, "B": B, "T": 1}
    reason = budget.shortfall(clock.estimate(name, label, B, 1) + 5)
    if reason:
        return {**row, "skipped": reason}
    dtype = jnp.float32 if smoke else jnp.bfloat16
    attempt(row, measure_quantized, named_config(name), dtype, kernels, scheme, B, smoke, roofline)
    if "compile_s" in row:
        clock.measured(name, label, B, 1, row["compile_s"])
    return row


def quantized_weight(seed: int, out: int, width: int, scheme: str) -> QuantizedWeight:
    """A random [out, width] weight quantized by rwkv7_core.quantization (library default group)."""
    w = np.random.default_rng(seed).standard_normal((out, width), np.float32) / math.sqrt(width)
    q, scale = quantize(w, spec_for(scheme))
    return QuantizedWeight(jnp.asarray(q), jnp.asarray(scale))


def quantized_parity(interpret: bool, smoke: bool) -> list:
    """The quantized kernels on the device against their plain-jnp references: rows of
    kernel_parity (float32 activations; 2.9b widths, tiny in --smoke)."""
    C, F = (128, 512) if smoke else (2560, 10240)
    p = functools.partial
    linear = p(quantized_linear.quantized_linear, out_dtype=jnp.float32, interpret=interpret)
    reference = p(quantized_linear.quantized_linear_reference, out_dtype=jnp.float32)
    mix = p(quantized_channel_mix.quantized_channel_mix, interpret=interpret)
    fused = lambda *a: fused_channel_mix(*a, skip=True, interpret=interpret).total()  # noqa: E731
    x = lambda seed, M, K: jax.random.normal(jax.random.key(seed), (M, K))  # noqa: E731
    cases = [("quantized_linear int8 M=1", linear, reference, (x(1, 1, F), quantized_weight(1, C, F, "int8")))]
    if not smoke:
        cases += [("quantized_linear fp8 M=8", linear, reference, (x(2, 8, C), quantized_weight(2, F, C, "fp8"))),
                  ("quantized_linear int8 M=16 skip", p(linear, skip=True), reference,
                   (jnp.maximum(x(3, 16, F), 0), quantized_weight(3, C, F, "int8"))),
                  ("quantized_linear int4 M=1 skip", p(linear, skip=True), reference,
                   (jnp.maximum(x(6, 1, F), 0), quantized_weight(6, C, F, "int4")))]
        for scheme, M in (("int8", 1), ("fp8", 4)):
            args = (x(4, M, C), quantized_weight(4, F, C, scheme), quantized_weight(5, C, F, scheme))
            cases += [(f"quantized_channel_mix {scheme} M={M}", mix,
                       quantized_channel_mix.quantized_channel_mix_reference, args),
                      (f"fused channel-mix {scheme} M={M}", fused,
                       quantized_channel_mix.quantized_channel_mix_reference, args)]
    with jax.default_matmul_precision("highest"):
        return [attempt({"case": label}, kernel_parity, fn, ref, args, 1e-4) for label, fn, ref, args in cases]


def run_quantized(smoke: bool, interpret: bool, roofline: dict, budget: Budget, clock: CompileClock):
    """The quantized kernels' device parity, then the decode rows (quantized_items) within
    QUANTIZED_BUDGET_S; yields after each."""
    fused, pallas, _ = kernel_names(interpret)
    limit, out = budget.capped(QUANTIZED_BUDGET_S), {"rows": []}
    out["parity"] = quantized_parity(interpret, smoke)
    yield out
    for name, kernels, scheme, B in quantized_items(smoke, fused, pallas):
        out["rows"].append(quantized_row(name, kernels, scheme, B, smoke, roofline, limit, clock))
        yield out
