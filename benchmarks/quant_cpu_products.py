"""One projection at a time on XLA:CPU: float32 x @ w.T vs the int8 product (one row, B = 1).

For each 0.1b projection shape ([out, in]: the four time-mix ones, the channel-mix key and
value, the head) the compiled one-row product of a float32 weight and of the same weight as
int8 with groups of 128 (``pallas_kernels.quantized``: the dequantize fused into a one-row
product), interleaved over --rounds; median wall ms, weights per second and the int8 / float32
ratio, and the step's sum over its 12 layers + head. This is where the B = 1 bound of the
quantized step comes from (docs/models.md): float32 streams its weight from memory, int8 runs
compute-bound in XLA's fused loop (sign-extend, convert, scale, multiply, add per weight).
Run it pinned to one core for numbers that do not depend on the thread pool:
``taskset -c 1 python benchmarks/quant_cpu_products.py``. Writes
benchmarks/results/quant_cpu_products.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.quantized import QuantizedWeight, quantized_matmul_f32
from rwkv7_core.quantization import quantize, spec_for

RESULTS = Path(__file__).resolve().parent / "results" / "quant_cpu_products.json"
SHAPES = {"time-mix r/k/v/o": ((768, 768), 48), "channel-mix key": ((3072, 768), 12),
          "channel-mix value": ((768, 3072), 12), "head": ((65536, 768), 1)}  # shape, products per step


def time_ms(fn, args, seconds: float) -> float:
    fn(*args).block_until_ready()
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        fn(*args).block_until_ready()
        calls += 1
    return 1e3 * (time.perf_counter() - start) / calls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    f32 = jax.jit(lambda x, w: x @ w.T)
    int8 = jax.jit(quantized_matmul_f32)
    rows = {}
    for name, ((n, k), per_step) in SHAPES.items():
        w = rng.standard_normal((n, k)).astype(np.float32)
        qw = QuantizedWeight(*map(jnp.asarray, quantize(w, spec_for("int8"))))
        x, w = jnp.asarray(rng.standard_normal((1, k)), jnp.float32), jnp.asarray(w)
        runs = {"float32": [], "int8": []}
        for _ in range(args.rounds):
            runs["float32"].append(time_ms(f32, (x, w), args.seconds))
            runs["int8"].append(time_ms(int8, (x, qw), args.seconds))
        med = {s: statistics.median(v) for s, v in runs.items()}
        rows[name] = {"shape": [n, k], "per_step": per_step, "ms": med,
                      "gweights_per_s": {s: n * k / m / 1e6 for s, m in med.items()},
                      "ratio": med["float32"] / med["int8"]}
        print(name, rows[name], flush=True)
    step = {s: sum(r["ms"][s] * r["per_step"] for r in rows.values()) for s in ("float32", "int8")}
    out = {"cpus_usable": len(os.sched_getaffinity(0)), "load_average_at_end": os.getloadavg(), "rounds": args.rounds,
           "products": rows, "step_projection_ms": step, "step_ratio": step["float32"] / step["int8"]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    lines = [f"One-row products on XLA:CPU ({out['cpus_usable']} usable core(s), load average at the end "
             f"{out['load_average_at_end'][0]:.1f}), median of {args.rounds} interleaved rounds.", "",
             "| projection | shape | per step | float32 ms (G weights/s) | int8 ms (G weights/s) | float32 / int8 |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['shape'][0]}x{r['shape'][1]} | {r['per_step']} | {r['ms']['float32']:.3f} "
                     f"({r['gweights_per_s']['float32']:.1f}) | {r['ms']['int8']:.3f} ({r['gweights_per_s']['int8']:.1f}) | "
                     f"{r['ratio']:.2f}x |")
    lines.append(f"| all projections of a step | | | {step['float32']:.1f} | {step['int8']:.1f} | {out['step_ratio']:.2f}x |")
    text = "\n".join(lines) + "\n"
    args.output.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
