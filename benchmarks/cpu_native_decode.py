"""The CPU decode step with kernels="native" against kernels="xla", interleaved in one process.

A random 0.1b-shape checkpoint (12 layers, 768 wide, vocab 65,536) loaded per weight format
(float32; int8 groups of 64; bfloat16); for each batch size the engine's compiled forward step
(state donated and carried, no sampling) of both kernel sets is timed in rounds that alternate
which goes first, so machine load hits both alike. Prints and writes the median tok/s per case
and the median of the per-round ratios to ``benchmarks/results/cpu_native_decode.{json,md}``.

Run: ``PYTHONPATH=. python benchmarks/cpu_native_decode.py [--batches 1,4,8,32] [--rounds 3]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from benchmarks.results_io import cpu_model, write_results
from rwkv7_core.config import named_config
from rwkv7_core.random_weights import write_random_checkpoint
from rwkv_jax.engine import JaxEngine

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_native_decode.json"
FORMATS = {"float32": ("float32", "none", None), "int8": ("float32", "int8", 64), "bfloat16": ("bfloat16", "none", None)}
KERNELS = ("xla", "native")


def rate(engine: JaxEngine, B: int, seconds: float) -> float:
    """tok/s of the compiled B-row decode step over >= seconds (after one warm-up call)."""
    m, exe = engine.model, engine.executables.get(("forward", (B, 1, False)))
    tokens = jnp.asarray(np.random.default_rng(B).integers(0, m.config.vocab_size, (B, 1)), jnp.int32)
    state = m.init_state(B)
    logits, state = exe(m.params, tokens, state)
    logits.block_until_ready()
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        logits, state = exe(m.params, tokens, state)
        logits.block_until_ready()
        calls += 1
    return B * calls / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,4,8,32")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    runs: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "m.pth"
        write_random_checkpoint(ckpt, named_config("0.1b"), seed=0)
        for fmt in args.formats.split(","):
            dtype, quantization, group = FORMATS[fmt]
            engines = {k: JaxEngine(rwkv_jax.load(ckpt, dtype=dtype, quantization=quantization, group_size=group,
                                                  kernels=k)) for k in KERNELS}
            for B in batches:
                case = runs.setdefault(f"{fmt} B={B}", {k: [] for k in KERNELS})
                for r in range(args.rounds):
                    for k in (KERNELS if r % 2 == 0 else KERNELS[::-1]):
                        case[k].append(rate(engines[k], B, args.seconds))
                print(f"{fmt} B={B}: " + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in case.items()) + " tok/s",
                      flush=True)
            del engines
    table = {c: {**{f"{k}_median": statistics.median(v[k]) for k in KERNELS},
                 "ratio_median": statistics.median(n / x for n, x in zip(v["native"], v["xla"]))} for c, v in runs.items()}
    cpu = cpu_model()
    out = {"host": {"cpu": cpu, "cpus": os.cpu_count(), "jax": jax.__version__}, "rounds": args.rounds,
           "seconds_per_measurement": args.seconds, "load_average_at_end": os.getloadavg(), "runs": runs, "table": table}
    lines = [f"Decode step of a random 0.1b-shape model, kernels=native vs kernels=xla; host {cpu}, {os.cpu_count()} "
             f"CPUs, jax {jax.__version__}, {args.rounds} interleaved rounds; load average at the end "
             f"{', '.join(f'{x:.1f}' for x in out['load_average_at_end'])}.", "",
             "| case | xla tok/s | native tok/s | native / xla (median of rounds) |", "|---|---|---|---|"]
    lines += [f"| {c} | {v['xla_median']:.1f} | {v['native_median']:.1f} | **{v['ratio_median']:.2f}** |"
              for c, v in table.items()]
    write_results(args.output, out, lines)


if __name__ == "__main__":
    main()
