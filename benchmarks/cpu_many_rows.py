"""The native CPU products of many rows (``cpu_kernels``, B = 8-128) against XLA's GEMM, in GFLOP/s.

For each 0.1b [N, K] product shape (time-mix [768, 768] x 48 layers' worth, channel-mix key
[3,072, 768] x 12, head [65,536, 768]) and weight kind (float32; bfloat16 weights with float32
rows; bfloat16 x bfloat16 by the dot-product kernel where the build has it), and the channel-mix
value held [K, N] ([3,072 -> 768] x 12, bfloat16 x bfloat16 by its dot-product kernel), one jitted call
runs every copy of the weight from x [M, K] and sums each result, as the decode step runs
them: native (``cpu_kernels.linear``'s FFI targets, called directly so the row bounds of
``max_rows`` do not apply) and XLA's op (``pallas_kernels.small_m_linear.matmul_f32``),
interleaved over --reps repetitions. Prints and writes the median GFLOP/s to
``benchmarks/results/cpu_many_rows.{json,md}``, with the host's register-only peak measured
by ``benchmarks/cpu_peak_flops.cc`` when --peak names its built binary.

Run: ``PYTHONPATH=. python benchmarks/cpu_many_rows.py [--rows 8,16,32,64] [--kinds ...] [--peak ./peak]``
(the peak probe: ``g++ -O2 -march=native -pthread benchmarks/cpu_peak_flops.cc -o peak``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.results_io import cpu_model, write_results
from cpu_kernels import library
from pallas_kernels.small_m_linear import matmul_f32

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_many_rows.json"
SHAPES = {"time-mix [768, 768] x48": (768, 768, 48), "key [3072, 768] x12": (3072, 768, 12),
          "head [65536, 768]": (65536, 768, 1)}
SHAPES_KN = {"value [3072 -> 768] x12": (768, 3072, 12)}  # (N, K, copies), weights held [K, N]
# kind -> (target, x dtype, weight dtype, weight layout as matmul_f32's w_in_axis)
KINDS = {"float32": ("rwkv7_linear_f32", jnp.float32, jnp.float32, 1),
         "bfloat16 weights": ("rwkv7_linear_bf16", jnp.float32, jnp.bfloat16, 1),
         "bfloat16 dot": ("rwkv7_linear_bf16_dot", jnp.bfloat16, jnp.bfloat16, 1),
         "bfloat16 dot [K N]": ("rwkv7_linear_kn_bf16_dot", jnp.bfloat16, jnp.bfloat16, 0)}


def calls(target: str, x_dtype, w_dtype, axis: int, M: int, N: int, K: int, copies: int, rng):
    """(native, xla) jitted functions of (x, weights) and their arguments."""
    x = jnp.asarray(rng.standard_normal((M, K)), x_dtype)
    ws = [jnp.asarray(rng.standard_normal((N, K) if axis == 1 else (K, N)), w_dtype) for _ in range(copies)]
    out = jax.ShapeDtypeStruct((M, N), jnp.float32)
    native = jax.jit(lambda x, ws: sum(jax.ffi.ffi_call(target, out)(x, w).sum() for w in ws))
    xla = jax.jit(lambda x, ws: sum(matmul_f32(x, w, axis).sum() for w in ws))
    return native, xla, (x, ws)


def median_seconds(fns: dict, args, reps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        jax.block_until_ready(f(*args))
    for _ in range(reps):
        for k, f in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def peak(binary: str | None) -> str:
    if not binary:
        return "not measured (--peak)"
    lines = subprocess.run([binary], capture_output=True, text=True, check=True).stdout.splitlines()
    return "; ".join(line for line in lines if "GFLOP/s" in line)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="8,16,32,64")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    ap.add_argument("--peak", default=None, help="the built benchmarks/cpu_peak_flops.cc binary")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    lib = library.load()
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    for kind in args.kinds.split(","):
        target, x_dtype, w_dtype, axis = KINDS[kind]
        if kind.startswith("bfloat16 dot") and library.BF16_DOT not in lib.capabilities:
            continue
        for label, (N, K, copies) in (SHAPES if axis == 1 else SHAPES_KN).items():
            for M in (int(m) for m in args.rows.split(",")):
                native, xla, call_args = calls(target, x_dtype, w_dtype, axis, M, N, K, copies, rng)
                s = median_seconds({"native": native, "xla": xla}, call_args, args.reps)
                flops = 2 * M * N * K * copies
                rows.append({"kind": kind, "shape": label, "rows": M,
                             **{f"{k}_gflops": flops / v / 1e9 for k, v in s.items()}})
                r = rows[-1]
                print(f"{kind} {label} M={M}: native {r['native_gflops']:.0f}, xla {r['xla_gflops']:.0f} GFLOP/s",
                      flush=True)
    cpu = cpu_model()
    out = {"host": {"cpu": cpu, "cpus": os.cpu_count(), "jax": jax.__version__,
                    "capabilities": sorted(lib.capabilities)}, "peak": peak(args.peak), "reps": args.reps, "rows": rows}
    lines = [f"Native many-row products vs XLA's op, GFLOP/s (median of {args.reps} interleaved repetitions); host "
             f"{cpu}, {os.cpu_count()} CPUs, jax {jax.__version__}, build capabilities "
             f"{', '.join(out['host']['capabilities']) or 'none'}; register-only peak: {out['peak']}.", "",
             "| weights | product | rows | native | xla | native / xla |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['shape']} | {r['rows']} | {r['native_gflops']:.0f} | {r['xla_gflops']:.0f} | "
              f"**{r['native_gflops'] / r['xla_gflops']:.2f}** |" for r in rows]
    write_results(args.output, out, lines)


if __name__ == "__main__":
    main()
