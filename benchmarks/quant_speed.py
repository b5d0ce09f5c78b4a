"""CPU decode speed of quantized weights vs float32, interleaved in one run (JAX, 0.1b shape).

One random 0.1b checkpoint loaded as float32, int8 (default groups) and fp8 (float32
activations; --schemes picks others, e.g. int4; --dtype bfloat16 loads every scheme as a
bfloat16 model instead, its unquantized weights, LoRA matrices and rows in bfloat16, the baseline
then bfloat16 weights). Each round times the compiled decode step
(state donated and carried) of every model at B = 1, 8, 32 (--batches), the models' order
rotating per round so machine load hits them alike; the median tok/s per (model, B) over the
rounds is reported, with the bytes of weights a step
reads (all parameters but the embedding, a gather of B rows) and the int8 / float32 ratio (the
issue's goal: >= 2x at B = 1). Writes benchmarks/results/quant_speed_cpu.json and .md.

--kernels picks the CPU kernels (default native, what the engine runs on the CPU; xla for XLA's
own ops, as the results before the native kernels were measured).

Run: ``python benchmarks/quant_speed.py`` (~3 min on 2 cores; --seconds, --rounds to change).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rwkv_jax
from rwkv7_core.config import named_config
from rwkv7_core.random_weights import write_random_checkpoint
from rwkv_jax.engine import JaxEngine

RESULTS = Path(__file__).resolve().parent / "results" / "quant_speed_cpu.json"
BATCHES = (1, 8, 32)
SCHEMES = ("none", "int8", "fp8")


def step_bytes(params: dict) -> int:
    """Bytes of the weights one decode step reads: every parameter but the embedding table."""
    return sum(x.nbytes for key, x in jax.tree.leaves_with_path(params)
               if getattr(key[0], "key", None) != "emb")


def decode_tok_s(engine: JaxEngine, B: int, seconds: float) -> tuple[float, float]:
    """(tok/s, process CPU seconds per step): CPU time counts the work of every thread and
    not the time spent waiting for a core, so it varies less with the machine's load."""
    m, exe = engine.model, engine.executables.get(("forward", (B, 1, False)))
    tokens = jnp.asarray(np.random.default_rng(B).integers(0, m.config.vocab_size, (B, 1)), jnp.int32)
    state = m.init_state(B)
    logits, state = exe(m.params, tokens, state)
    logits.block_until_ready()
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while calls < 3 or time.perf_counter() - start < seconds:
        logits, state = exe(m.params, tokens, state)
        logits.block_until_ready()
        calls += 1
    return B * calls / (time.perf_counter() - start), (time.process_time() - cpu) / calls


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="0.1b")
    ap.add_argument("--seconds", type=float, default=3.0, help="per (model, B) per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output", type=Path, default=RESULTS)
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated, the first none (float32)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    ap.add_argument("--kernels", default="native", choices=("native", "xla"))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the model dtype of every scheme (rows, LoRA matrices, unquantized weights)")
    args = ap.parse_args(argv)
    schemes, batches = tuple(args.schemes.split(",")), tuple(int(b) for b in args.batches.split(","))
    if schemes[0] != "none":
        ap.error("--schemes must start with none (the float32 baseline)")
    config = named_config(args.config)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        write_random_checkpoint(path, config, seed=0)
        engines = {s: JaxEngine(rwkv_jax.load(path, dtype=args.dtype, quantization=s, kernels=args.kernels))
                   for s in schemes}
    for engine in engines.values():
        for B in batches:
            engine.executables.get(("forward", (B, 1, False)))
    runs = {s: {B: [] for B in batches} for s in schemes}
    cpu_runs = {s: {B: [] for B in batches} for s in schemes}
    for r in range(args.rounds):
        order = schemes[r % len(schemes):] + schemes[:r % len(schemes)]
        for B in batches:
            for s in order:
                tok_s, cpu_s = decode_tok_s(engines[s], B, args.seconds)
                runs[s][B].append(tok_s)
                cpu_runs[s][B].append(cpu_s)
        print(f"round {r + 1}: " + ", ".join(f"{s} B{B} {runs[s][B][-1]:.1f}" for s in schemes for B in batches),
              flush=True)
    med = {s: {B: statistics.median(v) for B, v in runs[s].items()} for s in schemes}
    cpu = {s: {B: statistics.median(v) for B, v in cpu_runs[s].items()} for s in schemes}
    out = {"config": args.config, "kernels": args.kernels, "dtype": args.dtype, "cpus": os.cpu_count(),
           "jax": jax.__version__,
           "rounds": args.rounds,
           "seconds_per_measurement": args.seconds, "load_average_at_end": os.getloadavg(),
           "step_weight_bytes": {s: step_bytes(e.model.params) for s, e in engines.items()},
           "decode_tok_s_median": med, "decode_tok_s_runs": runs, "cpu_ms_per_step_median": {
               s: {B: 1e3 * v for B, v in cpu[s].items()} for s in schemes},
           "ratio_vs_unquantized": {s: {B: med[s][B] / med["none"][B] for B in batches}
                                    for s in schemes if s != "none"}}
    if "int8" in schemes and 1 in batches and args.dtype == "float32":
        out["goal_int8_b1_vs_float32 (>=2)"] = out["ratio_vs_unquantized"]["int8"][1]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    base = args.dtype  # the unquantized baseline's name
    lines = [f"Decode tok/s, {args.config} shape, JAX kernels {args.kernels} on {os.cpu_count()} CPUs, median of "
             f"{args.rounds} "
             f"interleaved rounds ({args.dtype} model: rows and unquantized weights); load average at the end "
             f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}. CPU ms/step: process CPU time per step (all "
             f"threads, waiting for a core excluded).", "",
             "| weights | step weight bytes | " + " | ".join(f"B={B} tok/s (x {base})" for B in batches) + " |",
             "|---|---|" + "---|" * len(batches)]
    for s in schemes:
        cells = [f"{med[s][B]:.1f}" + ("" if s == "none" else f" ({out['ratio_vs_unquantized'][s][B]:.2f}x)")
                 for B in batches]
        lines.append(f"| {base if s == 'none' else s} | {out['step_weight_bytes'][s] / 1e6:.0f} MB | "
                     + " | ".join(cells) + " |")
    lines += ["", "| weights | " + " | ".join(f"B={B} CPU ms/step (x {base})" for B in batches) + " |",
              "|---|" + "---|" * len(batches)]
    for s in schemes:
        cells = [f"{1e3 * cpu[s][B]:.0f}" + ("" if s == "none" else f" ({cpu['none'][B] / cpu[s][B]:.2f}x)")
                 for B in batches]
        lines.append(f"| {base if s == 'none' else s} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    args.output.with_suffix(".md").write_text(text)
    print(text)
    print(f"wrote {args.output} and {args.output.with_suffix('.md')}")


if __name__ == "__main__":
    main()
