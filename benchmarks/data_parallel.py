"""Data-parallel throughput: rwkv7-generate with 1 and 2 replicas on the same workload.

Local replicas run on two forced XLA CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=2),
Ray replicas as actors of a local cluster (`--ray local`); the runs of each mode are
interleaved (1, 2, 1, 2, ...) after one warm-up run that fills the persistent compilation
cache. Throughput: generated tokens / the run's generation wall time (metrics
``wall_time_s``: start-up and model loading excluded, loading the precompiled executables
included), and the same over the window from the first decode step to the end (``steady``);
scaling efficiency = tok/s with 2 replicas / (2 x tok/s with 1). On a 2-core machine two replicas compete for the same cores
as one replica's intra-op threads, so read the efficiency as what this machine gives, not
as what one device per replica gives.

    PYTHONPATH=. python benchmarks/data_parallel.py [--rounds 2] [--requests 64] [--no-ray]

Writes benchmarks/results/data_parallel_cpu.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"


def workload(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "tokens": rng.integers(1, 512, size=int(rng.integers(4, 32))).tolist(),
                                "max_tokens": int(rng.integers(32, 96))}) + "\n")


def run(args, work: Path, replicas: int, ray: bool, tag: str) -> dict:
    out, metrics = work / f"out-{tag}.jsonl", work / f"m-{tag}.json"
    cmd = [sys.executable, "-m", "rwkv7_apps.generate", "--random-model", args.model, "--input", str(work / "in.jsonl"),
           "--output", str(out), "--max-batch", str(args.max_batch), "--precompile", "--data-parallel", str(replicas),
           "--metrics", str(metrics)] + (["--ray", "local"] if ray else [])
    env = dict(os.environ, XDG_CACHE_HOME=str(work / "cache"), JAX_PLATFORMS="cpu", TQDM_DISABLE="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    m = json.loads(metrics.read_text())
    out.unlink()
    steady_s = m["wall_time_s"] - m["bucket_timeline"][0]["t"]
    return {"replicas": replicas, "ray": ray, "wall_s": m["wall_time_s"], "steady_s": steady_s,
            "generated": m["tokens"]["generated"], "tok_s": m["tokens"]["generated"] / m["wall_time_s"],
            "steady_tok_s": m["tokens"]["generated"] / steady_s, "per_replica": [r["requests"] for r in m["replicas"]]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-ray", action="store_true")
    args = p.parse_args()
    modes = [False] + ([] if args.no_ray else [True])
    runs = []
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        workload(work / "in.jsonl", args.requests)
        run(args, work, 2, False, "warmup")  # fills the compilation cache for both devices
        run(args, work, 1, False, "warmup1")
        for ray in modes:
            for k in range(args.rounds):
                for n in (1, 2):
                    r = run(args, work, n, ray, f"{ray}-{n}-{k}")
                    print(json.dumps(r), flush=True)
                    runs.append(r)
    summary = []
    for ray in modes:
        for key in ("tok_s", "steady_tok_s"):
            rate = {n: statistics.median(r[key] for r in runs if r["ray"] == ray and r["replicas"] == n)
                    for n in (1, 2)}
            summary.append({"mode": "ray actors" if ray else "local devices", "measure": key, "tok_s_1": rate[1],
                            "tok_s_2": rate[2], "scaling_efficiency": rate[2] / (2 * rate[1])})
    result = {"machine": f"{os.cpu_count()} CPU cores", "load_average": os.getloadavg(), "model": args.model, "requests": args.requests,
              "max_batch": args.max_batch, "rounds": args.rounds, "runs": runs, "summary": summary}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "data_parallel_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Data-parallel throughput ({result['machine']}, {args.model}, {args.requests} requests, "
             f"--max-batch {args.max_batch}, median of {args.rounds} interleaved rounds)", "",
             f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}", "",
             "| mode | throughput over | 1 replica tok/s | 2 replicas tok/s | scaling efficiency |",
             "|---|---|---|---|---|"]
    over = {"tok_s": "generation wall time", "steady_tok_s": "first decode step to end"}
    lines += [f"| {s['mode']} | {over[s['measure']]} | {s['tok_s_1']:.0f} | {s['tok_s_2']:.0f} | "
              f"{100 * s['scaling_efficiency']:.0f}% |" for s in summary]
    (RESULTS / "data_parallel_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
