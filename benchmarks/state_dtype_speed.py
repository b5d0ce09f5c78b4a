"""CPU decode speed with a float32, bfloat16 and float16 wkv state, interleaved.

The jitted forward decode step (--kernels, default native: the CPU engine's; xla for XLA's
own ops; state donated and carried) of a random model (--config, default 0.1b; --dtype weights,
default float32) at B = 1 and 32, for each state dtype in turn, --rounds times alternating, so
that the load of a shared machine hits all alike; reports the median tok/s of each and each
16-bit state's ratio to float32 (no goal: the CPU has no 16-bit arithmetic, the state is widened
as it is read and rounded as it is written). Writes benchmarks/results/state_dtype_speed.json/.md
(``--output``). Run: ``python benchmarks/state_dtype_speed.py [--kernels xla] [--dtype bfloat16]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if __package__ in (None, ""):  # run as a script from the source tree
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import rwkv_jax  # noqa: E402
from benchmarks.results_io import write_results  # noqa: E402
from rwkv7_core.config import named_config  # noqa: E402
from rwkv_jax.random_params import random_params  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STATE_DTYPES = ("float32", "bfloat16", "float16")


def time_steps(fn, params, state, B: int, config, seconds: float, kernels: str) -> float:
    """tok/s of the decode step over at least `seconds` (after 3 warm-up steps)."""
    tokens = jnp.zeros((B, 1), jnp.int32)
    kw = dict(config=config, path=rwkv_jax.select_path(B, 1), kernels=kernels)
    for _ in range(3):
        logits, state = fn(params, tokens, state, **kw)
    jax.block_until_ready(logits)
    n, t0 = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - t0 < seconds:
        logits, state = fn(params, tokens, state, **kw)
        n += 1
    jax.block_until_ready(logits)
    return B * n / (time.perf_counter() - t0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="0.1b")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--kernels", default="native", choices=("native", "xla"))
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--output", type=Path, default=RESULTS / "state_dtype_speed.json")
    args = ap.parse_args(argv)
    config, dtype = named_config(args.config), getattr(jnp, args.dtype)
    params = random_params(config, dtype, seed=0)
    fn = jax.jit(rwkv_jax.forward_fn, static_argnames=("config", "path", "kernels"), donate_argnames=("state",))
    samples: dict = {}
    for _ in range(args.rounds):
        for B in map(int, args.batch.split(",")):
            for sd in STATE_DTYPES:
                state = rwkv_jax.init_state(config, B, dtype, getattr(jnp, sd))
                samples.setdefault(f"{sd} B={B}", []).append(
                    time_steps(fn, params, state, B, config, args.seconds, args.kernels))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    out = {"config": args.config, "dtype": args.dtype, "kernels": args.kernels, "rounds": args.rounds,
           "jax": jax.__version__, "cpus": os.cpu_count(), "tok_s": medians, "samples": samples,
           "note": "shared 2-core machine; interleaved rounds"}
    lines = [f"CPU decode tok/s (JAX, kernels {args.kernels}, {args.config} {args.dtype} weights, median of "
             f"{args.rounds} interleaved rounds of {args.seconds:g} s, {os.cpu_count()} CPUs, jax {jax.__version__})", "",
             "| B | float32 state | bfloat16 state | float16 state | bfloat16 / float32 | float16 / float32 |",
             "|---|---|---|---|---|---|"]
    for B in map(int, args.batch.split(",")):
        f32, bf16, f16 = (medians[f"{sd} B={B}"] for sd in STATE_DTYPES)
        lines.append(f"| {B} | {f32:.1f} | {bf16:.1f} | {f16:.1f} | {bf16 / f32:.2f} | {f16 / f32:.2f} |")
    write_results(args.output, out, lines)


if __name__ == "__main__":
    main()
