"""One projection at a time on XLA:CPU: float32 x @ w.T vs the int8 product (one row, B = 1).

For each 0.1b projection shape ([out, in]: the four time-mix ones, the channel-mix key and
value, the head) the compiled one-row product of float32 weights and of the same weights as
int8 with groups of 128, as the decode step runs them: the row comes from a LayerNorm + token
mix in the same program, and each call walks through enough distinct copies of the weight
(>= 64 MB of int8) that they stream from memory, not from cache. Three forms, interleaved over
--rounds: float32 and int8 as the step runs them (``pallas_kernels.small_m_linear.matmul_f32``;
int8: the row computed once, the dequantize fused into the product's loop); and int8 with the
dequantize fused but the row's producers left to XLA, which fuses them into the loop and
recomputes them for every output row (the form before ``computed_once``). Median wall ms per
product, weights per second, the ratios, and the step's sum over its 12 layers + head: the
B = 1 bound of the quantized step (docs/models.md). Run it pinned to one core for numbers
that do not depend on the thread pool:
``taskset -c 1 python benchmarks/quant_cpu_products.py``. Writes
benchmarks/results/quant_cpu_products.json and .md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.quantized import QuantizedWeight
from pallas_kernels.shift_mix import layer_norm
from pallas_kernels.small_m_linear import matmul_f32
from rwkv7_core.quantization import quantize, spec_for

RESULTS = Path(__file__).resolve().parent / "results" / "quant_cpu_products.json"
SHAPES = {"time-mix r/k/v/o": ((768, 768), 48), "channel-mix key": ((3072, 768), 12),
          "channel-mix value": ((768, 3072), 12), "head": ((65536, 768), 1)}  # shape, products per step
STREAMED_BYTES = 64 << 20  # int8 bytes of distinct weight copies per call (past the 32 MB L3 here)
FORMS = ("float32", "int8", "int8, row recomputed")


def row(h, vecs):
    """The product's input row as the step makes it: LayerNorm, then the token-shift mix."""
    x = layer_norm(h, vecs[0], vecs[1])
    return x + (vecs[2] - x) * vecs[3]


def products(form: str):
    """jitted (h [1, K], vecs [4, K], weights) -> one [1, N] product per weight, in `form`."""
    def one(x, w):
        if form == "int8, row recomputed":
            return x @ w.dequantize(jnp.float32).T
        return matmul_f32(x, w)  # the model's product, float32 or quantized

    return jax.jit(lambda h, vecs, ws: [one(row(h, vecs), w) for w in ws])


def time_ms(fn, args, seconds: float) -> float:
    """Wall ms of one call of fn(*args)."""
    jax.block_until_ready(fn(*args))
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        jax.block_until_ready(fn(*args))
        calls += 1
    return 1e3 * (time.perf_counter() - start) / calls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    fns = {form: products(form) for form in FORMS}
    rows = {}
    for name, ((n, k), per_step) in SHAPES.items():
        copies = math.ceil(STREAMED_BYTES / (n * k))
        floats = [rng.standard_normal((n, k), np.float32) for _ in range(copies)]
        weights = {"float32": [jnp.asarray(w) for w in floats]}
        weights["int8"] = weights["int8, row recomputed"] = [
            QuantizedWeight(*map(jnp.asarray, quantize(w, spec_for("int8", 128)))) for w in floats]
        del floats
        h = jnp.asarray(rng.standard_normal((1, k)), jnp.float32)
        vecs = jnp.asarray(rng.standard_normal((4, k)), jnp.float32)
        runs = {form: [] for form in FORMS}
        for _ in range(args.rounds):
            for form in FORMS:
                runs[form].append(time_ms(fns[form], (h, vecs, weights[form]), args.seconds) / copies)
        del weights
        med = {form: statistics.median(v) for form, v in runs.items()}
        rows[name] = {"shape": [n, k], "per_step": per_step, "copies": copies, "ms": med,
                      "gweights_per_s": {form: n * k / m / 1e6 for form, m in med.items()},
                      "float32_over": {form: med["float32"] / m for form, m in med.items()}}
        print(name, rows[name], flush=True)
    step = {form: sum(r["ms"][form] * r["per_step"] for r in rows.values()) for form in FORMS}
    out = {"cpus_usable": len(os.sched_getaffinity(0)), "load_average_at_end": os.getloadavg(), "rounds": args.rounds,
           "products": rows, "step_projection_ms": step,
           "step_float32_over": {form: step["float32"] / ms for form, ms in step.items()}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"One-row products on XLA:CPU ({out['cpus_usable']} usable core(s), load average at the end "
             f"{out['load_average_at_end'][0]:.1f}), median of {args.rounds} interleaved rounds; the row from a "
             f"LayerNorm + mix in the same program, the weights streamed from memory (distinct copies, >= "
             f"{STREAMED_BYTES >> 20} MB of int8 per call). ms per product (G weights/s; float32 ms / this).", "",
             "| projection | shape | per step | " + " | ".join(FORMS) + " |", "|---|---|---|" + "---|" * len(FORMS)]
    for name, r in rows.items():
        cells = [f"{r['ms'][f]:.3f} ({r['gweights_per_s'][f]:.1f}"
                 + ("" if f == "float32" else f"; {r['float32_over'][f]:.2f}x") + ")" for f in FORMS]
        lines.append(f"| {name} | {r['shape'][0]}x{r['shape'][1]} | {r['per_step']} | " + " | ".join(cells) + " |")
    lines.append("| all projections of a step | | | " + " | ".join(
        f"{step[f]:.1f}" + ("" if f == "float32" else f" ({out['step_float32_over'][f]:.2f}x)") for f in FORMS) + " |")
    text = "\n".join(lines) + "\n"
    args.output.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
