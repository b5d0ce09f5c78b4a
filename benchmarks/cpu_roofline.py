"""The 0.1b CPU decode step against what this host allows: measured ceilings, the bounds they set on
tok/s at B = 1 and B = 32, and the measured step as a share of them (issue 42's goals).

Ceilings, measured here:
- stream: the native one-row products over weights far larger than the last-level cache (int8
  [262,144, 768] and float32 [65,536, 768], 200 MB each; the faster, GB/s), probed at the start
  of every round (the host's bandwidth moves with its other load) and the best kept: a low reading
  is the host's other load, not a lower ceiling (a one-round run's lone probe once read 37 GB/s,
  under the rate a measured step then reached). A step of one row reads every weight once, so it
  cannot beat stream / its bytes.
- peak: the register-only arithmetic rate on every thread (``benchmarks/cpu_peak_flops.cc``,
  built here with the native kernels' compiler): float32 FMAs for float32 rows, the bfloat16 dot
  product (AVX512_BF16) for bfloat16 rows. A step of 32 rows is bound by its flops at that rate
  plus its wkv state read and written at the stream rate (a float32 state: 37.7 MB a direction at
  0.1b); the weights are taken to stream under the arithmetic for free, so the bound is generous.

For each format (float32; bfloat16; int8 in groups of 64 with float32 rows, and with bfloat16
rows) the step is compiled (native kernels, float32 state) at B = 1 and 32 and timed in rounds,
the formats' order rotating per round; the median tok/s is reported beside its bound. The
ratio line divides the best B = 32 by the best B = 1: measured, with B = 32 at its bound, and
with both at their bounds. A faster B = 1 lowers the ratio: with both steps at their ceilings it
is the most the two can give together on this host with these formats.

Run: ``PYTHONPATH=. python benchmarks/cpu_roofline.py`` (~2 min on 2 cores; --rounds, --seconds).
Writes benchmarks/results/cpu_roofline.json and .md.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from benchmarks.cpu_step_profile import FORMATS, params_for
from benchmarks.results_io import cpu_model, write_results
from cpu_kernels import library
from cpu_kernels.linear import matmul_f32
from pallas_kernels.quantized import QuantizedWeight
from rwkv7_core.config import named_config
from rwkv7_core.cost import step_bytes_and_flops
from rwkv7_core.state import state_shapes
from rwkv_jax.compilation import compiler_options

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_roofline.json"
PEAK_SOURCE = Path(__file__).resolve().with_name("cpu_peak_flops.cc")
BATCHES = (1, 32)
# format -> the arithmetic its rows take at B = 32 (cpu_peak_flops.cc's line)
ARITHMETIC = {"float32": "float32 FMA", "bfloat16": "bfloat16 dot", "int8": "float32 FMA",
              "int8 bfloat16-rows": "bfloat16 dot"}


def stream_probe(rng: np.random.Generator) -> Callable[[], float]:
    """A probe returning the GB/s of the native one-row products over 200 MB weights (the faster
    of int8 and float32; median of 5 calls each)."""
    K, G = 768, 64
    q = rng.integers(-127, 128, (262_144, K), dtype=np.int8)
    weights = [QuantizedWeight(jnp.asarray(q), jnp.asarray(rng.random((q.shape[0], K // G), np.float32) * 0.01)),
               jnp.asarray(rng.standard_normal((65_536, K), np.float32))]
    x = jnp.asarray(rng.standard_normal((1, K), np.float32))
    product = jax.jit(matmul_f32)
    for w in weights:
        jax.block_until_ready(product(x, w))

    def probe() -> float:
        rates = []
        for w in weights:
            seconds = []
            for _ in range(5):
                start = time.perf_counter()
                jax.block_until_ready(product(x, w))
                seconds.append(time.perf_counter() - start)
            rates.append(sum(leaf.nbytes for leaf in jax.tree.leaves(w)) / statistics.median(seconds) / 1e9)
        return max(rates)
    return probe


def peak_gflops() -> dict[str, float]:
    """{'float32 FMA': GFLOP/s, 'bfloat16 dot': GFLOP/s} on 2 threads from cpu_peak_flops.cc (the
    bfloat16 line only where the host has AVX512_BF16)."""
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "peak"
        subprocess.run([library.compiler(), "-O2", "-march=native", "-pthread", str(PEAK_SOURCE), "-o", str(binary)],
                       check=True)
        out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"^(float32 FMA|bfloat16 dot) 512-bit, (\d+) threads: (\d+) GFLOP/s", out, re.M)
    return {what: float(rate) for what, threads, rate in found if int(threads) == 2}


def step_rates(config, params: dict[str, dict], rounds: int, seconds: float,
               stream: Callable[[], float]) -> tuple[dict[tuple[str, int], float], float]:
    """Median tok/s of the compiled native decode step per (format, B) of each format's params,
    formats rotating per round, and the best of the stream probe run at the start of each round
    (the host's bandwidth moves with its other load, so the bound is measured beside the steps)."""
    steps = {}
    for fmt, B in itertools.product(params, BATCHES):
        dtype = FORMATS[fmt][0]
        tokens = jnp.asarray(np.random.default_rng(B).integers(0, config.vocab_size, (B, 1)), jnp.int32)
        fn = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"), donate_argnames=("state",))
        exe = fn.lower(params[fmt], tokens, rwkv_jax.init_state(config, B, dtype), config=config,
                       path=rwkv_jax.select_path(B, 1), kernels="native").compile(compiler_options("cpu"))
        steps[fmt, B] = (exe, params[fmt], tokens, rwkv_jax.init_state(config, B, dtype))
    rates: dict[tuple[str, int], list[float]] = {key: [] for key in steps}
    keys, streams = list(steps), []
    for r in range(rounds):
        streams.append(stream())
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            exe, weights, tokens, state = steps[key]
            logits, state = exe(weights, tokens, state)
            logits.block_until_ready()
            calls, start = 0, time.perf_counter()
            while calls < 3 or time.perf_counter() - start < seconds:
                logits, state = exe(weights, tokens, state)
                logits.block_until_ready()
                calls += 1
            rates[key].append(calls * key[1] / (time.perf_counter() - start))
            steps[key] = (exe, weights, tokens, state)
    return {key: statistics.median(v) for key, v in rates.items()}, max(streams)


def bounds(config, fmt: str, params: dict, stream: float, peak: dict[str, float]) -> dict:
    """The format's bytes and flops a step (float32 state) and its tok/s bounds at B = 1 and 32."""
    itemsize = jnp.dtype(FORMATS[fmt][0]).itemsize
    total = sum(leaf.nbytes for leaf in jax.tree.leaves(params))
    one, _ = step_bytes_and_flops(config, total, itemsize, 1, 1)
    B = BATCHES[-1]
    _, flops = step_bytes_and_flops(config, total, itemsize, B, 1)
    state = 2 * 4 * math.prod(state_shapes(config, B)["wkv"])  # the float32 wkv, read and written
    rate = peak.get(ARITHMETIC[fmt])
    seconds = flops / (rate * 1e9) + state / (stream * 1e9) if rate else None
    return {"format": fmt, "bytes_b1": one, "flops_b32": flops, "state_bytes_b32": state, "arithmetic": ARITHMETIC[fmt],
            "bound_b1": stream * 1e9 / one, "bound_b32": B / seconds if seconds else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="timing window per (format, B) a round")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    lib = library.load()
    config = named_config("0.1b")
    params = {f: params_for(config, f) for f in ARITHMETIC
              if ARITHMETIC[f] != "bfloat16 dot" or library.BF16_DOT in lib.capabilities}
    peak = peak_gflops()
    measured, stream = step_rates(config, params, args.rounds, args.seconds, stream_probe(np.random.default_rng(0)))
    print(f"stream {stream:.1f} GB/s; peak {peak}", flush=True)
    rows = [bounds(config, f, p, stream, peak) for f, p in params.items()]
    for row in rows:
        row["tok_s_b1"], row["tok_s_b32"] = measured[row["format"], 1], measured[row["format"], 32]
    best_b1 = max(r["tok_s_b1"] for r in rows)
    best_b32 = max(r["tok_s_b32"] for r in rows)
    bound_b32 = max(r["bound_b32"] for r in rows if r["bound_b32"])
    out = {"host": {"cpu": cpu_model(), "cpus": os.cpu_count(), "jax": jax.__version__,
                    "capabilities": sorted(lib.capabilities)},
           "stream_GBps": stream, "peak_GFLOPs": peak, "rounds": args.rounds, "rows": rows,
           "ratio_measured": best_b32 / best_b1, "ratio_bound": bound_b32 / best_b1,
           "ratio_bounds": bound_b32 / max(r["bound_b1"] for r in rows)}
    peaks = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peak.items())
    lines = [f"0.1b decode step (native kernels, float32 state) against this host's ceilings: stream {stream:.1f} GB/s "
             f"(the native one-row products over 200 MB, the best of a probe each round), register-only peak on 2 threads {peaks}. Host {cpu_model()}, "
             f"{os.cpu_count()} CPUs, jax {jax.__version__}; tok/s the median of {args.rounds} rounds.", "",
             "| format | MB a B=1 step | B=1 bound | B=1 | share | B=32 bound | B=32 | share |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b32 = (f"{r['bound_b32']:.0f} | {r['tok_s_b32']:.0f} | {r['tok_s_b32'] / r['bound_b32']:.0%}" if r["bound_b32"]
               else f"(no peak measured) | {r['tok_s_b32']:.0f} | ")
        lines.append(f"| {r['format']} | {r['bytes_b1'] / 1e6:.0f} | {r['bound_b1']:.0f} | {r['tok_s_b1']:.0f} | "
                     f"{r['tok_s_b1'] / r['bound_b1']:.0%} | {b32} |")
    lines += ["", f"Best B=32 / best B=1: measured **{out['ratio_measured']:.1f}x**; the best B=32 bound over the "
              f"measured best B=1 **{out['ratio_bound']:.1f}x** (the most faster batched kernels alone could give here "
              f"with these formats); the best B=32 bound over the best B=1 bound **{out['ratio_bounds']:.1f}x** "
              "(both steps at their ceilings)."]
    write_results(args.output, out, lines)


if __name__ == "__main__":
    main()
